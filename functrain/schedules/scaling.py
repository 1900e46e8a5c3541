"""Composer's scale schedule ratio: stretch a schedule and the run's duration by one factor.

Example:
    >>> from functrain.schedules import linear
    >>> s = scale_schedule_ratio(linear(t_max="100ba"), 0.5)
    >>> scale_duration("100ba", 0.5), s(25) == linear(t_max="100ba")(50)
    (Time(50, 'ba'), True)
"""

from __future__ import annotations

import math
from typing import Any

from ..units import Time, TimeLike, TimeUnit
from .base import _EPS, Schedule, _number

__all__ = ["scale_schedule_ratio", "scale_duration"]


def _ratio(ratio: Any) -> float:
    ratio = _number(ratio, "ratio")
    if ratio <= 0:
        raise ValueError(
            f"the scale schedule ratio must be > 0 (e.g. 0.5 halves the run), got {ratio}"
        )
    return ratio


def scale_schedule_ratio(schedule: Schedule, ratio: float) -> Schedule:
    """`schedule` stretched by `ratio`: every Time field not in "dur" units is multiplied by it.

    Train for `scale_duration(duration, ratio)` with this schedule and the run follows the same
    curve, `scaled(ratio * t) == schedule(t)`. Warm-ups keep their length unless the schedule has
    `scale_warmup=True`. Unlike Composer, the scaled times are exact (fractional batches are
    kept, not truncated).

    Args:
        schedule: a `Schedule` (plain functions cannot be scaled: their times are not visible).
        ratio: the stretch factor, > 0.
    Returns:
        a schedule of the same type.
    Example:
        >>> from functrain.schedules import step
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
