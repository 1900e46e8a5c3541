"""Pure schedules: functions of training time, with Composer's formulas, names and defaults.

A schedule maps the run's progress -- a `Timestamp`, or a number of batches -- to a float
*multiplier* of a base value, like Composer's schedulers. Multiply it by a number to get an
absolute value: optimizers take `lr=1e-3 * cosine_annealing()`.

Every schedule is a frozen dataclass of plain data (numbers, `Time`s, tuples): it compares,
hashes and prints, round-trips through `to_config` / `from_config` (JSON-able, no pickle), and
`scale_schedule_ratio` rewrites its Time fields to stretch it with the run.

Time arguments accept "100ba", "2ep", "4096sp", "1e6tok", "0.5dur", a `Time`, or an int of
batches. Batches, epochs and "dur" are measured in batches (epochs and "dur" resolve through
`Timestamp.to_batches`, which needs the run's horizon and says so when it is unknown); samples and
tokens are measured on the timestamp's own counters. Wall-clock units are refused: a schedule
must give the same value when a run resumes.

Example:
    >>> lr = 1e-3 * cosine_annealing_with_warmup(t_warmup="10ba", t_max="110ba")
    >>> lr(0), lr(5), lr(10), round(lr(60), 9), lr(110)
    (0.0, 0.0005, 0.001, 0.0005, 0.0)
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from .time import Time, TimeLike, Timestamp, TimeUnit

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
    "scale_schedule_ratio",
    "scale_duration",
    "from_config",
]

# Relative slack for the discrete schedules (step, milestones, t_max of constant): a time such as
# "0.3dur" of 100 batches resolves to 30.000000000000004 batches, which batch 30 must reach.
_EPS = 1e-12
_REGISTRY: dict[str, type[Schedule]] = {}


# ---------------------------------------------------------------------------------------------
# Measuring time


def _as_timestamp(t: Timestamp | int) -> Timestamp:
    """A `Timestamp` from a timestamp or a number of batches (fractions allowed)."""
    if isinstance(t, Timestamp):
        return t
    if getattr(t, "ndim", None) == 0 and hasattr(t, "item"):
        t = t.item()  # a 0-d tensor or array count, e.g. one restored from a checkpoint
    if isinstance(t, numbers.Real) and not isinstance(t, bool):
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"a schedule's time must be a finite count of batches >= 0, got {t}")
        return Timestamp(batch=t)
    raise TypeError(
        f"a schedule takes a functrain.Timestamp or a number of batches, got {type(t).__name__}"
    )


def _schedule_time(value: TimeLike, field: str, *, positive: bool = False) -> Time:
    """`value` as a `Time` fit for a schedule field (not wall clock; > 0 when `positive`)."""
    time = Time.coerce(value)
    if time.unit is TimeUnit.SECOND:
        raise ValueError(
            f"{field}={time}: schedules cannot use wall-clock time, since the value at a step must "
            "not change when a run resumes; use batches, epochs, samples, tokens or 'dur'"
        )
    if positive and time.value == 0:
        raise ValueError(f"{field}={time} must be a positive length of time, such as '100ba'")
    return time


def _number(value: Any, field: str, *, minimum: float | None = None, strict: bool = False) -> float:
    """`value` as a finite float, optionally bounded below (strictly when `strict`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"{field} must be a finite real number, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{field} must be {'>' if strict else '>='} {minimum}, got {value}")
    return float(value)


def _on_axis(ts: Timestamp, time: Time) -> tuple[float, float]:
    """`(now, time)` as numbers on `time`'s own axis: samples, tokens, or else batches."""
    if time.unit in (TimeUnit.SAMPLE, TimeUnit.TOKEN):
        now = float(ts.get(time.unit))
        if now == 0 and ts.batch > 0:
            # A silent zero here would freeze the schedule (an endless warm-up), so say why.
            raise ValueError(
                f"{time} is counted in {time.unit.value!r}, but none were counted in {ts.batch} "
                "batches; have the step count them (make_step(count_tokens=...) for tokens) or "
                "express the time in batches, epochs or 'dur'"
            )
        return now, float(time.value)
    return float(ts.batch), float(ts.to_batches(time))


def _reached(now: float, end: float) -> bool:
    return now >= end - _EPS * max(1.0, abs(end))


def _count(now: float, period: float) -> int:
    """How many whole `period`s fit in `now` (with float slack, see `_EPS`)."""
    q = now / period
    return math.floor(q + _EPS * max(1.0, q))


def _clip01(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def _cosine(tau: float, alpha_f: float) -> float:
    """Half a cosine from 1 (tau = 0) down to alpha_f (tau >= 1)."""
    return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + math.cos(math.pi * _clip01(tau)))


def _warmup_fraction(ts: Timestamp, t_warmup: Time) -> float | None:
    """t / t_warmup during the warm-up; None once it is over (or when there is none)."""
    now, warm = _on_axis(ts, t_warmup)
    return now / warm if now < warm else None


def _after_warmup(ts: Timestamp, t_warmup: Time, t_max: Time) -> float:
    """Composer's tau_w = (t - t_warmup) / (t_max - t_warmup) in [0, 1]; 0 if t_max <= t_warmup."""
    if _on_axis_unit(t_warmup) is _on_axis_unit(t_max):
        now, warm = _on_axis(ts, t_warmup)
        end = _on_axis(ts, t_max)[1]
    elif ts.batch == 0:
        return 0.0  # nothing trained yet; samples/tokens cannot be converted to batches yet
    else:
        now, warm, end = float(ts.batch), ts.to_batches(t_warmup), ts.to_batches(t_max)
    return _clip01((now - warm) / (end - warm)) if end > warm else 0.0


def _on_axis_unit(time: Time) -> TimeUnit:
    return time.unit if time.unit in (TimeUnit.SAMPLE, TimeUnit.TOKEN) else TimeUnit.BATCH


# ---------------------------------------------------------------------------------------------
# The base class and the scaled (absolute) schedule


class Schedule(abc.ABC):
    """Base of the schedules: a frozen dataclass whose `at(timestamp)` gives the multiplier.

    Subclasses with a `name` class attribute are registered for `from_config`.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Halving(Schedule):
        ...     name: ClassVar[str] = "halving"
        ...     every: int = 10
        ...     def at(self, ts):
        ...         return 0.5 ** (ts.batch // self.every)
        >>> Halving()(25), Halving(every=5).to_config()
        (0.25, {'name': 'halving', 'every': 5})
    """

    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            _REGISTRY[cls.name] = cls

    @abc.abstractmethod
    def at(self, ts: Timestamp) -> float:
        """The multiplier at `ts` (a `Timestamp`); `__call__` also accepts a batch count."""

    def __call__(self, t: Timestamp | int) -> float:
        """The multiplier at `t` (a `Timestamp`, or a number of batches)."""
        ts = _as_timestamp(t)
        try:
            return float(self.at(ts))
        except ValueError as e:
            raise ValueError(f"{self!r} at batch {ts.batch}: {e}") from e

    def __mul__(self, factor: float) -> Scaled:
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
            return NotImplemented
        return Scaled(self, factor)

    __rmul__ = __mul__

    def to_config(self) -> dict[str, Any]:
        """A JSON-able dict (`{"name": ..., field: value}`) that `from_config` rebuilds."""
        if not self.name or _REGISTRY.get(self.name) is not type(self):
            raise TypeError(f"{type(self).__name__} has no registered `name`; give it one")
        return {"name": self.name} | {
            f.name: _to_json(getattr(self, f.name)) for f in dataclasses.fields(self)
        }

    def _scaled(self, ratio: float) -> Schedule:
        changes = {}
        for f in dataclasses.fields(self):
            if f.name == "t_warmup" and not getattr(self, "scale_warmup", True):
                continue  # Composer: warm-up keeps its length unless scale_warmup=True
            changes[f.name] = _scale_field(getattr(self, f.name), ratio)
        return dataclasses.replace(self, **changes)


def _to_json(value: Any) -> Any:
    if isinstance(value, Time):
        return str(value)
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, Schedule):
        return value.to_config()
    if callable(value):
        raise TypeError(f"cannot describe {value!r} as config; write it as a Schedule subclass")
    return value


def _scale_field(value: Any, ratio: float) -> Any:
    if isinstance(value, Time):
        # "dur" is a fraction of the run, which scale_duration already stretches.
        return value if value.unit is TimeUnit.DURATION else value * ratio
    if isinstance(value, tuple):
        return tuple(_scale_field(v, ratio) for v in value)
    if isinstance(value, Schedule):
        return value._scaled(ratio)
    if callable(value):
        raise TypeError(
            f"cannot scale {value!r}: it is not a functrain Schedule, so its times are unknown"
        )
    return value


@dataclasses.dataclass(frozen=True)
class Scaled(Schedule):
    """`factor * schedule(t)`: a multiplier schedule turned into an absolute value.

    Made by `1e-3 * schedule` or `schedule * 1e-3`; `schedule` may also be any callable of a
    timestamp (a plain function), though only `Schedule`s scale and serialise.

    Example:
        >>> (2.0 * linear())(Timestamp(batch=25, max_batches=100))
        1.5
    """

    name: ClassVar[str] = "scaled"
    schedule: Callable[[Timestamp], float]
    factor: float

    def __post_init__(self):
        if not callable(self.schedule):
            raise TypeError(f"Scaled needs a schedule (a callable of time), got {self.schedule!r}")
        object.__setattr__(self, "factor", _number(self.factor, "factor"))

    def __mul__(self, factor: float) -> Scaled:
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
            return NotImplemented
        return Scaled(self.schedule, self.factor * factor)

    __rmul__ = __mul__

    def at(self, ts: Timestamp) -> float:
        inner = self.schedule.at(ts) if isinstance(self.schedule, Schedule) else self.schedule(ts)
        return self.factor * inner


# ---------------------------------------------------------------------------------------------
# Schedules without warm-up


@dataclasses.dataclass(frozen=True)
class ConstantSchedule(Schedule):
    """`alpha` until `t_max`, then 1.0 (Composer's ConstantScheduler).

    Args:
        alpha: the multiplier while the schedule is active.
        t_max: how long it is active.
    Example:
        >>> s = constant(alpha=0.5, t_max="10ba")
        >>> s(9), s(10)
        (0.5, 1.0)
    """

    name: ClassVar[str] = "constant"
    alpha: float = 1.0
    t_max: TimeLike = "1dur"

    def __post_init__(self):
        object.__setattr__(self, "alpha", _number(self.alpha, "alpha"))
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max"))

    def at(self, ts: Timestamp) -> float:
        return 1.0 if _reached(*_on_axis(ts, self.t_max)) else self.alpha


@dataclasses.dataclass(frozen=True)
class StepSchedule(Schedule):
    """`gamma ** floor(t / step_size)` (Composer's StepScheduler).

    Args:
        step_size: the time between decays.
        gamma: the decay factor.
    Example:
        >>> s = step("10ba", gamma=0.5)
        >>> s(9), s(10), s(25)
        (1.0, 0.5, 0.25)
    """

    name: ClassVar[str] = "step"
    step_size: TimeLike
    gamma: float = 0.1

    def __post_init__(self):
        object.__setattr__(
            self, "step_size", _schedule_time(self.step_size, "step_size", positive=True)
        )
        object.__setattr__(self, "gamma", _number(self.gamma, "gamma", minimum=0.0))

    def at(self, ts: Timestamp) -> float:
        return self.gamma ** _count(*_on_axis(ts, self.step_size))


def _milestones(value: Any) -> tuple[Time, ...]:
    if isinstance(value, (str, Time, numbers.Number)) or not isinstance(value, Sequence):
        raise TypeError(
            f"milestones must be a list of times such as ['30ep', '60ep'], got {value!r}"
        )
    return tuple(_schedule_time(m, f"milestones[{i}]") for i, m in enumerate(value))


@dataclasses.dataclass(frozen=True)
class MultiStepSchedule(Schedule):
    """`gamma ** (number of milestones reached)` (Composer's MultiStepScheduler).

    Args:
        milestones: the times at which the multiplier is multiplied by `gamma`.
        gamma: the decay factor.
    Example:
        >>> s = multistep(["10ba", "20ba"], gamma=0.5)
        >>> s(9), s(10), s(20)
        (1.0, 0.5, 0.25)
    """

    name: ClassVar[str] = "multistep"
    milestones: Sequence[TimeLike]
    gamma: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "milestones", _milestones(self.milestones))
        object.__setattr__(self, "gamma", _number(self.gamma, "gamma", minimum=0.0))

    def at(self, ts: Timestamp) -> float:
        return self.gamma ** sum(_reached(*_on_axis(ts, m)) for m in self.milestones)


@dataclasses.dataclass(frozen=True)
class LinearSchedule(Schedule):
    """`alpha_i + (alpha_f - alpha_i) * min(1, t / t_max)` (Composer's LinearScheduler).

    Args:
        alpha_i: the multiplier at the start.
        alpha_f: the multiplier at `t_max` and after.
        t_max: how long the ramp lasts.
    Example:
        >>> linear(t_max="100ba")(25)
        0.75
    """

    name: ClassVar[str] = "linear"
    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: TimeLike = "1dur"

    def __post_init__(self):
        object.__setattr__(self, "alpha_i", _number(self.alpha_i, "alpha_i"))
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max", positive=True))

    def at(self, ts: Timestamp) -> float:
        now, end = _on_axis(ts, self.t_max)
        return self.alpha_i + (self.alpha_f - self.alpha_i) * min(1.0, now / end)


@dataclasses.dataclass(frozen=True)
class ExponentialSchedule(Schedule):
    """`gamma ** (t / decay_period)` (Composer's ExponentialScheduler).

    Args:
        gamma: the decay factor per period (> 0).
        decay_period: the time over which the multiplier shrinks by `gamma`.
    Example:
        >>> exponential(0.5, decay_period="10ba")(15)
        0.3535533905932738
    """

    name: ClassVar[str] = "exponential"
    gamma: float
    decay_period: TimeLike = "1ep"

    def __post_init__(self):
        object.__setattr__(self, "gamma", _number(self.gamma, "gamma", minimum=0.0, strict=True))
        period = _schedule_time(self.decay_period, "decay_period", positive=True)
        object.__setattr__(self, "decay_period", period)

    def at(self, ts: Timestamp) -> float:
        now, period = _on_axis(ts, self.decay_period)
        return self.gamma ** (now / period)


@dataclasses.dataclass(frozen=True)
class CosineAnnealingSchedule(Schedule):
    """`alpha_f + (1 - alpha_f) * (1 + cos(pi * tau)) / 2`, `tau = min(1, t / t_max)`.

    Composer's CosineAnnealingScheduler.

    Args:
        t_max: how long the decay lasts.
        alpha_f: the multiplier at `t_max` and after.
    Example:
        >>> cosine_annealing(t_max="100ba")(50)
        0.5
    """

    name: ClassVar[str] = "cosine_annealing"
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max", positive=True))
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))

    def at(self, ts: Timestamp) -> float:
        now, end = _on_axis(ts, self.t_max)
        return _cosine(now / end, self.alpha_f)


@dataclasses.dataclass(frozen=True)
class CosineAnnealingWarmRestartsSchedule(Schedule):
    """Cosine annealing restarted after cycles of `t_0`, `t_0 * t_mult`, `t_0 * t_mult**2`, ...

    Composer's CosineAnnealingWarmRestartsScheduler, with exact (not truncated) cycle lengths:
    in cycle i, `tau_i = (t - t_0 * sum_{j<i} t_mult**j) / (t_0 * t_mult**i)`.

    Args:
        t_0: the length of the first cycle.
        t_mult: the factor by which each cycle is longer than the last (> 0).
        alpha_f: the multiplier at the end of each cycle.
    Example:
        >>> s = cosine_annealing_warm_restarts("10ba", t_mult=2.0)
        >>> s(5), s(10), s(20)
        (0.5, 1.0, 0.5)
    """

    name: ClassVar[str] = "cosine_annealing_warm_restarts"
    t_0: TimeLike
    t_mult: float = 1.0
    alpha_f: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "t_0", _schedule_time(self.t_0, "t_0", positive=True))
        object.__setattr__(self, "t_mult", _number(self.t_mult, "t_mult", minimum=0.0, strict=True))
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))

    def _cycle_start(self, i: int, t0: float) -> float:
        """Where cycle i starts: t0 * (m**i - 1) / (m - 1), accurate even for m close to 1."""
        d = self.t_mult - 1.0
        return i * t0 if d == 0.0 else t0 * math.expm1(i * math.log1p(d)) / d

    def at(self, ts: Timestamp) -> float:
        now, t0 = _on_axis(ts, self.t_0)
        m = self.t_mult
        if m == 1.0:
            i = _count(now, t0)
        else:
            if m < 1.0 and _reached(now, t0 / (1.0 - m)):
                axis = {"sp": "samples", "tok": "tokens"}.get(self.t_0.unit.value, "batches")
                raise ValueError(
                    f"with t_mult={m} < 1 the cycles add up to only {t0 / (1.0 - m):g} {axis} "
                    "and the run is past that; use t_mult >= 1"
                )
            # Invert the cycle start for i, then step past any float rounding at the boundary.
            i = max(0, math.floor(math.log1p(now * (m - 1.0) / t0) / math.log1p(m - 1.0)))
            while i > 0 and self._cycle_start(i, t0) > now:
                i -= 1
            while _reached(now, self._cycle_start(i + 1, t0)):
                i += 1
        start, length = self._cycle_start(i, t0), t0 * m**i
        return _cosine((now - start) / length, self.alpha_f)


@dataclasses.dataclass(frozen=True)
class PolynomialSchedule(Schedule):
    """`alpha_f + (1 - alpha_f) * (1 - tau) ** power`, `tau = min(1, t / t_max)`.

    Composer's PolynomialScheduler.

    Args:
        power: the exponent (>= 0).
        t_max: how long the decay lasts.
        alpha_f: the multiplier at `t_max` and after.
    Example:
        >>> polynomial(2.0, t_max="100ba")(50)
        0.25
    """

    name: ClassVar[str] = "polynomial"
    power: float
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "power", _number(self.power, "power", minimum=0.0))
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max", positive=True))
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))

    def at(self, ts: Timestamp) -> float:
        now, end = _on_axis(ts, self.t_max)
        return self.alpha_f + (1.0 - self.alpha_f) * (1.0 - min(1.0, now / end)) ** self.power


# ---------------------------------------------------------------------------------------------
# Schedules with a linear warm-up: t / t_warmup times the value the warm-up ends at, then the
# schedule. As in Composer, `t_max` is when the whole schedule ends (warm-up included), and
# scale_schedule_ratio leaves `t_warmup` alone unless `scale_warmup=True`.


def _warmup_fields(self: Schedule) -> None:
    object.__setattr__(self, "t_warmup", _schedule_time(self.t_warmup, "t_warmup"))
    if not isinstance(self.scale_warmup, bool):
        raise TypeError(f"scale_warmup must be True or False, got {self.scale_warmup!r}")
    if hasattr(self, "t_max"):
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max"))


@dataclasses.dataclass(frozen=True)
class ConstantWithWarmupSchedule(Schedule):
    """Warm up to `alpha`, hold it until `t_max`, then 1.0 (Composer's ConstantWithWarmupScheduler).

    Args:
        t_warmup: the warm-up time.
        alpha: the multiplier after the warm-up, until `t_max`.
        t_max: when the schedule ends.
        scale_warmup: whether `scale_schedule_ratio` also stretches the warm-up.
    Example:
        >>> s = constant_with_warmup("10ba", alpha=0.5, t_max="20ba")
        >>> s(4), s(10), s(20)
        (0.2, 0.5, 1.0)
    """

    name: ClassVar[str] = "constant_with_warmup"
    t_warmup: TimeLike
    alpha: float = 1.0
    t_max: TimeLike = "1dur"
    scale_warmup: bool = False

    def __post_init__(self):
        _warmup_fields(self)
        object.__setattr__(self, "alpha", _number(self.alpha, "alpha"))

    def at(self, ts: Timestamp) -> float:
        warm = _warmup_fraction(ts, self.t_warmup)
        if warm is not None:
            return self.alpha * warm
        return 1.0 if _reached(*_on_axis(ts, self.t_max)) else self.alpha


@dataclasses.dataclass(frozen=True)
class LinearWithWarmupSchedule(Schedule):
    """Warm up to `alpha_i`, then go linearly to `alpha_f` at `t_max`.

    Composer's LinearWithWarmupScheduler: `alpha_i + (alpha_f - alpha_i) * tau_w` with
    `tau_w = (t - t_warmup) / (t_max - t_warmup)` clipped to [0, 1].

    Args:
        t_warmup: the warm-up time.
        alpha_i: the multiplier at the end of the warm-up.
        alpha_f: the multiplier at `t_max` and after.
        t_max: when the schedule ends.
        scale_warmup: whether `scale_schedule_ratio` also stretches the warm-up.
    Example:
        >>> s = linear_with_warmup("10ba", t_max="110ba")
        >>> s(5), s(10), s(60), s(110)
        (0.5, 1.0, 0.5, 0.0)
    """

    name: ClassVar[str] = "linear_with_warmup"
    t_warmup: TimeLike
    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: TimeLike = "1dur"
    scale_warmup: bool = False

    def __post_init__(self):
        _warmup_fields(self)
        object.__setattr__(self, "alpha_i", _number(self.alpha_i, "alpha_i"))
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))

    def at(self, ts: Timestamp) -> float:
        warm = _warmup_fraction(ts, self.t_warmup)
        if warm is not None:
            return self.alpha_i * warm
        tau = _after_warmup(ts, self.t_warmup, self.t_max)
        return self.alpha_i + (self.alpha_f - self.alpha_i) * tau


@dataclasses.dataclass(frozen=True)
class CosineAnnealingWithWarmupSchedule(Schedule):
    """Warm up to 1, then cosine-anneal to `alpha_f` at `t_max`.

    Composer's CosineAnnealingWithWarmupScheduler: `alpha_f + (1 - alpha_f) * (1 + cos(pi *
    tau_w)) / 2` with `tau_w = (t - t_warmup) / (t_max - t_warmup)` clipped to [0, 1].

    Args:
        t_warmup: the warm-up time.
        t_max: when the schedule ends.
        alpha_f: the multiplier at `t_max` and after.
        scale_warmup: whether `scale_schedule_ratio` also stretches the warm-up.
    Example:
        >>> cosine_annealing_with_warmup("10ba", t_max="110ba")(60)
        0.5
    """

    name: ClassVar[str] = "cosine_annealing_with_warmup"
    t_warmup: TimeLike
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def __post_init__(self):
        _warmup_fields(self)
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))

    def at(self, ts: Timestamp) -> float:
        warm = _warmup_fraction(ts, self.t_warmup)
        if warm is not None:
            return warm
        return _cosine(_after_warmup(ts, self.t_warmup, self.t_max), self.alpha_f)


@dataclasses.dataclass(frozen=True)
class PolynomialWithWarmupSchedule(Schedule):
    """Warm up to 1, then decay as `alpha_f + (1 - alpha_f) * (1 - tau_w) ** power`.

    Composer's PolynomialWithWarmupScheduler, `tau_w` as in `linear_with_warmup`.

    Args:
        t_warmup: the warm-up time.
        power: the exponent (>= 0).
        t_max: when the schedule ends.
        alpha_f: the multiplier at `t_max` and after.
        scale_warmup: whether `scale_schedule_ratio` also stretches the warm-up.
    Example:
        >>> polynomial_with_warmup("10ba", t_max="110ba")(60)
        0.25
    """

    name: ClassVar[str] = "polynomial_with_warmup"
    t_warmup: TimeLike
    power: float = 2.0
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def __post_init__(self):
        _warmup_fields(self)
        object.__setattr__(self, "power", _number(self.power, "power", minimum=0.0))
        object.__setattr__(self, "alpha_f", _number(self.alpha_f, "alpha_f"))

    def at(self, ts: Timestamp) -> float:
        warm = _warmup_fraction(ts, self.t_warmup)
        if warm is not None:
            return warm
        tau = _after_warmup(ts, self.t_warmup, self.t_max)
        return self.alpha_f + (1.0 - self.alpha_f) * (1.0 - tau) ** self.power


@dataclasses.dataclass(frozen=True)
class MultiStepWithWarmupSchedule(Schedule):
    """Warm up to 1, then `gamma ** (number of milestones reached)`.

    Composer's MultiStepWithWarmupScheduler. Milestones inside the warm-up only take effect
    once it ends, so put them after it.

    Args:
        t_warmup: the warm-up time.
        milestones: the times at which the multiplier is multiplied by `gamma`.
        gamma: the decay factor.
        scale_warmup: whether `scale_schedule_ratio` also stretches the warm-up.
    Example:
        >>> s = multistep_with_warmup("10ba", ["20ba"], gamma=0.5)
        >>> s(5), s(10), s(20)
        (0.5, 1.0, 0.5)
    """

    name: ClassVar[str] = "multistep_with_warmup"
    t_warmup: TimeLike
    milestones: Sequence[TimeLike]
    gamma: float = 0.1
    scale_warmup: bool = False

    def __post_init__(self):
        _warmup_fields(self)
        object.__setattr__(self, "milestones", _milestones(self.milestones))
        object.__setattr__(self, "gamma", _number(self.gamma, "gamma", minimum=0.0))

    def at(self, ts: Timestamp) -> float:
        warm = _warmup_fraction(ts, self.t_warmup)
        if warm is not None:
            return warm
        return self.gamma ** sum(_reached(*_on_axis(ts, m)) for m in self.milestones)


# The public constructors carry Composer's names in snake_case.
constant = ConstantSchedule
step = StepSchedule
multistep = MultiStepSchedule
linear = LinearSchedule
exponential = ExponentialSchedule
cosine_annealing = CosineAnnealingSchedule
cosine_annealing_warm_restarts = CosineAnnealingWarmRestartsSchedule
polynomial = PolynomialSchedule
constant_with_warmup = ConstantWithWarmupSchedule
linear_with_warmup = LinearWithWarmupSchedule
cosine_annealing_with_warmup = CosineAnnealingWithWarmupSchedule
polynomial_with_warmup = PolynomialWithWarmupSchedule
multistep_with_warmup = MultiStepWithWarmupSchedule


# ---------------------------------------------------------------------------------------------
# Scale schedule ratio and config


def _ratio(ratio: Any) -> float:
    ratio = _number(ratio, "ratio")
    if ratio <= 0:
        raise ValueError(
            f"the scale schedule ratio must be > 0 (e.g. 0.5 halves the run), got {ratio}"
        )
    return ratio


def scale_schedule_ratio(schedule: Schedule, ratio: float) -> Schedule:
    """`schedule` stretched by `ratio`: every Time field not in "dur" units is multiplied by it.

    Composer's scale schedule ratio: train for `scale_duration(duration, ratio)` with this
    schedule and the run follows the same curve, `scaled(ratio * t) == schedule(t)`. Warm-ups
    keep their length unless the schedule has `scale_warmup=True`. Unlike Composer, the scaled
    times are exact (fractional batches are kept, not truncated).

    Args:
        schedule: a `Schedule` (plain functions cannot be scaled: their times are not visible).
        ratio: the stretch factor, > 0.
    Returns:
        a schedule of the same type.
    Example:
        >>> scale_schedule_ratio(step("10ba"), 0.5)
        StepSchedule(step_size=Time(5, 'ba'), gamma=0.1)
    """
    ratio = _ratio(ratio)
    if not isinstance(schedule, Schedule):
        raise TypeError(
            f"scale_schedule_ratio needs a functrain Schedule, got {schedule!r}; write custom "
            "schedules as frozen dataclasses subclassing functrain.schedules.Schedule"
        )
    return schedule if ratio == 1.0 else schedule._scaled(ratio)


def scale_duration(duration: TimeLike, ratio: float) -> Time:
    """The run's duration under a scale schedule ratio: `duration * ratio`.

    Batch, sample and token counts round up to a whole count (the run stops at the first batch
    that reaches the exact value anyway); epochs and seconds stay exact.

    Args:
        duration: the unscaled run length ("90ep", "10000ba", ...; not "dur").
        ratio: the stretch factor, > 0.
    Returns:
        the scaled duration as a `Time`.
    Example:
        >>> scale_duration("90ep", 0.5), scale_duration("1001ba", 0.5)
        (Time(45, 'ep'), Time(501, 'ba'))
    """
    ratio = _ratio(ratio)
    duration = Time.coerce(duration)
    if duration.unit is TimeUnit.DURATION:
        raise ValueError(
            f"a run's duration cannot be {duration}: 'dur' is a fraction of the duration itself; "
            "give it in epochs, batches, samples, tokens or seconds"
        )
    scaled = duration * ratio
    if duration.unit in (TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN):
        value = scaled.value
        scaled = Time(math.ceil(value - _EPS * max(1.0, value)), duration.unit)
    return scaled


def from_config(config: dict[str, Any]) -> Schedule:
    """Rebuild a schedule from `Schedule.to_config()` (nested schedules included).

    Example:
        >>> s = 1e-3 * cosine_annealing_with_warmup("100ba")
        >>> from_config(s.to_config()) == s
        True
    """
    if not isinstance(config, dict) or "name" not in config:
        raise TypeError(f"a schedule config is a dict with a 'name', got {config!r}")
    fields = dict(config)
    name = fields.pop("name")
    if name not in _REGISTRY:
        raise ValueError(f"unknown schedule {name!r}; known: {sorted(_REGISTRY)}")
    fields = {
        k: from_config(v) if isinstance(v, dict) and "name" in v else v for k, v in fields.items()
    }
    try:
        return _REGISTRY[name](**fields)
    except TypeError as e:
        raise TypeError(f"bad config for schedule {name!r}: {e}") from e
