"""The `Schedule` base class, `Scaled`, the config round-trip, and how schedules measure time.

Example:
    >>> from functrain.schedules import linear
    >>> from_config((2.0 * linear()).to_config()) == 2.0 * linear()
    True
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any, ClassVar

from ..units import Time, TimeLike, Timestamp, TimeUnit

__all__ = ["Schedule", "Scaled", "from_config"]

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
        >>> from functrain.schedules import linear
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
# Config


def from_config(config: dict[str, Any]) -> Schedule:
    """Rebuild a schedule from `Schedule.to_config()` (nested schedules included).

    Args:
        config: a dict with the schedule's registered `name` and its fields, as JSON gives it.
    Returns:
        the schedule, equal to the one the config was made from.
    Example:
        >>> from functrain.schedules import cosine_annealing_with_warmup
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
