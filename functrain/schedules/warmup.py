"""Schedules with a linear warm-up: `*_with_warmup` versions of the decays.

They share `t_warmup`, `t_max` and `scale_warmup` and the time `tau_w` after the warm-up; the
package docstring (`functrain.schedules`) explains them once.

Example:
    >>> s = polynomial_with_warmup("10ba", power=1.0, t_max="110ba", alpha_f=0.5)
    >>> s(5), s(10), s(60), s(110)
    (0.5, 1.0, 0.75, 0.5)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from ..units import Time, TimeLike, Timestamp, TimeUnit
from .base import Schedule, _clip01, _number, _on_axis, _reached, _schedule_time
from .decay import _cosine, _milestones

__all__ = [
    "ConstantWithWarmupSchedule",
    "LinearWithWarmupSchedule",
    "CosineAnnealingWithWarmupSchedule",
    "PolynomialWithWarmupSchedule",
    "MultiStepWithWarmupSchedule",
    "constant_with_warmup",
    "linear_with_warmup",
    "cosine_annealing_with_warmup",
    "polynomial_with_warmup",
    "multistep_with_warmup",
]


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


def _warmup_fields(self: Schedule) -> None:
    object.__setattr__(self, "t_warmup", _schedule_time(self.t_warmup, "t_warmup"))
    if not isinstance(self.scale_warmup, bool):
        raise TypeError(f"scale_warmup must be True or False, got {self.scale_warmup!r}")
    if hasattr(self, "t_max"):
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max"))


@dataclasses.dataclass(frozen=True)
class ConstantWithWarmupSchedule(Schedule):
    """Warm up to `alpha`, hold it until `t_max`, then 1.0.

    Args:
        t_warmup, t_max, scale_warmup: as in every warm-up schedule.
        alpha: the multiplier after the warm-up, until `t_max`.
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
    """Warm up to `alpha_i`, then `alpha_i + (alpha_f - alpha_i) * tau_w`.

    Args:
        t_warmup, t_max, scale_warmup: as in every warm-up schedule.
        alpha_i: the multiplier at the end of the warm-up.
        alpha_f: the multiplier at `t_max` and after.
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
    """Warm up to 1, then `alpha_f + (1 - alpha_f) * (1 + cos(pi * tau_w)) / 2`.

    Args:
        t_warmup, t_max, scale_warmup: as in every warm-up schedule.
        alpha_f: the multiplier at `t_max` and after.
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
    """Warm up to 1, then `alpha_f + (1 - alpha_f) * (1 - tau_w) ** power`.

    Args:
        t_warmup, t_max, scale_warmup: as in every warm-up schedule.
        power: the exponent (>= 0).
        alpha_f: the multiplier at `t_max` and after.
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

    Milestones inside the warm-up only take effect once it ends, so put them after it.

    Args:
        t_warmup, scale_warmup: as in every warm-up schedule.
        milestones: the times at which the multiplier is multiplied by `gamma`.
        gamma: the decay factor.
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
constant_with_warmup = ConstantWithWarmupSchedule
linear_with_warmup = LinearWithWarmupSchedule
cosine_annealing_with_warmup = CosineAnnealingWithWarmupSchedule
polynomial_with_warmup = PolynomialWithWarmupSchedule
multistep_with_warmup = MultiStepWithWarmupSchedule
