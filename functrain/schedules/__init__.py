"""Pure schedules: functions of training time, with Composer's formulas, names and defaults.

A schedule maps the run's progress -- a `Timestamp`, or a number of batches -- to a float
*multiplier* of a base value, like Composer's schedulers. Multiply it by a number to get an
absolute value: optimizers take `lr=1e-3 * cosine_annealing()`. Each `XSchedule` class follows
Composer's `XScheduler`; the snake_case constructors (`cosine_annealing`, ...) are the classes.

Every schedule is a frozen dataclass of plain data (numbers, `Time`s, tuples): it compares,
hashes and prints, round-trips through `to_config` / `from_config` (JSON-able, no pickle), and
`scale_schedule_ratio` rewrites its Time fields to stretch it with the run.

Time arguments accept "100ba", "2ep", "4096sp", "1e6tok", "0.5dur", a `Time`, or an int of
batches. Batches, epochs and "dur" are measured in batches (epochs and "dur" resolve through
`Timestamp.to_batches`, which needs the run's horizon and says so when it is unknown); samples and
tokens are measured on the timestamp's own counters. Wall-clock units are refused: a schedule
must give the same value when a run resumes.

The warm-up schedules (`*_with_warmup`) ramp linearly from 0 to the value the schedule starts at,
then follow it. They share these arguments:

- `t_warmup`: the warm-up time.
- `t_max`: when the schedule ends, warm-up included (as in Composer).
- `scale_warmup`: whether `scale_schedule_ratio` also stretches the warm-up (default: it keeps
  its length, as in Composer).

After the warm-up, `tau_w = (t - t_warmup) / (t_max - t_warmup)`, clipped to [0, 1] (and 0 when
`t_max <= t_warmup`), takes the place of `t / t_max` in the schedule's formula.

Modules: `base` (the `Schedule` base class, `Scaled`, config, how time is measured), `decay`
(schedules without warm-up), `warmup` (with warm-up), `one_cycle` (torch's `OneCycleLR`:
an lr multiplier and a momentum), `scaling` (scale schedule ratio).

Example:
    >>> lr = 1e-3 * cosine_annealing_with_warmup(t_warmup="10ba", t_max="110ba")
    >>> lr(0), lr(5), lr(10), round(lr(60), 9), lr(110)
    (0.0, 0.0005, 0.001, 0.0005, 0.0)
"""

from .base import Scaled, Schedule, from_config
from .decay import (
    ConstantSchedule,
    CosineAnnealingSchedule,
    CosineAnnealingWarmRestartsSchedule,
    ExponentialSchedule,
    LinearSchedule,
    MultiStepSchedule,
    PolynomialSchedule,
    StepSchedule,
    constant,
    cosine_annealing,
    cosine_annealing_warm_restarts,
    exponential,
    linear,
    multistep,
    polynomial,
    step,
)
from .one_cycle import (
    OneCycleMomentumSchedule,
    OneCycleSchedule,
    one_cycle,
    one_cycle_momentum,
)
from .scaling import scale_duration, scale_schedule_ratio
from .warmup import (
    ConstantWithWarmupSchedule,
    CosineAnnealingWithWarmupSchedule,
    LinearWithWarmupSchedule,
    MultiStepWithWarmupSchedule,
    PolynomialWithWarmupSchedule,
    constant_with_warmup,
    cosine_annealing_with_warmup,
    linear_with_warmup,
    multistep_with_warmup,
    polynomial_with_warmup,
)

__all__ = [
    "Schedule",
    "Scaled",
    "ConstantSchedule",
    "StepSchedule",
    "MultiStepSchedule",
    "LinearSchedule",
    "ExponentialSchedule",
    "CosineAnnealingSchedule",
    "CosineAnnealingWarmRestartsSchedule",
    "PolynomialSchedule",
    "ConstantWithWarmupSchedule",
    "LinearWithWarmupSchedule",
    "CosineAnnealingWithWarmupSchedule",
    "PolynomialWithWarmupSchedule",
    "MultiStepWithWarmupSchedule",
    "constant",
    "step",
    "multistep",
    "linear",
    "exponential",
    "cosine_annealing",
    "cosine_annealing_warm_restarts",
    "polynomial",
    "constant_with_warmup",
    "linear_with_warmup",
    "cosine_annealing_with_warmup",
    "polynomial_with_warmup",
    "multistep_with_warmup",
    "OneCycleSchedule",
    "OneCycleMomentumSchedule",
    "one_cycle",
    "one_cycle_momentum",
    "scale_schedule_ratio",
    "scale_duration",
    "from_config",
]
