"""Schedules without warm-up: constant, step, multistep, linear, exponential, cosine, polynomial.

Each gives a multiplier of the base value; `t` below is the run's progress on the axis of the
schedule's own time field (see `functrain.schedules`).

Example:
    >>> s = cosine_annealing(t_max="100ba", alpha_f=0.1)
    >>> s(0), round(s(50), 9), s(100)
    (1.0, 0.55, 0.1)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any, ClassVar

from ..units import Time, TimeLike, Timestamp
from .base import Schedule, _clip01, _count, _number, _on_axis, _reached, _schedule_time

__all__ = [
    "ConstantSchedule",
    "StepSchedule",
    "MultiStepSchedule",
    "LinearSchedule",
    "ExponentialSchedule",
    "CosineAnnealingSchedule",
    "CosineAnnealingWarmRestartsSchedule",
    "PolynomialSchedule",
    "constant",
    "step",
    "multistep",
    "linear",
    "exponential",
    "cosine_annealing",
    "cosine_annealing_warm_restarts",
    "polynomial",
]


def _cosine(tau: float, alpha_f: float) -> float:
    """Half a cosine from 1 (tau = 0) down to alpha_f (tau >= 1)."""
    return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + math.cos(math.pi * _clip01(tau)))


def _milestones(value: Any) -> tuple[Time, ...]:
    if isinstance(value, (str, Time, numbers.Number)) or not isinstance(value, Sequence):
        raise TypeError(
            f"milestones must be a list of times such as ['30ep', '60ep'], got {value!r}"
        )
    return tuple(_schedule_time(m, f"milestones[{i}]") for i, m in enumerate(value))


@dataclasses.dataclass(frozen=True)
class ConstantSchedule(Schedule):
    """`alpha` until `t_max`, then 1.0.

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
    """`gamma ** floor(t / step_size)`.

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


@dataclasses.dataclass(frozen=True)
class MultiStepSchedule(Schedule):
    """`gamma ** (number of milestones reached)`.

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
    """`alpha_i + (alpha_f - alpha_i) * min(1, t / t_max)`.

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
    """`gamma ** (t / decay_period)`.

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

    Unlike Composer, the cycle lengths are exact (not truncated): in cycle i,
    `tau_i = (t - t_0 * sum_{j<i} t_mult**j) / (t_0 * t_mult**i)`.

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


# The public constructors carry Composer's names in snake_case.
constant = ConstantSchedule
step = StepSchedule
multistep = MultiStepSchedule
linear = LinearSchedule
exponential = ExponentialSchedule
cosine_annealing = CosineAnnealingSchedule
cosine_annealing_warm_restarts = CosineAnnealingWarmRestartsSchedule
polynomial = PolynomialSchedule
