"""Training time: `Time` (an amount in one unit) and `Timestamp` (the run's counters).

A `Time` is a value and a unit: epochs ("ep"), batches ("ba"), samples ("sp"), tokens ("tok"),
a fraction of the whole run ("dur") or wall-clock seconds ("sec"; "90sec", "1h30m" and "2m" parse
to seconds). Times of one unit add, subtract, scale and compare; mixing units is an error, since
converting needs the run's shape, which only a `Timestamp` knows.

A `Timestamp` holds the counters the loop advances. It also carries the run's horizon
(`batches_per_epoch`, `max_batches`, 0 when unknown) so that `Timestamp.to_batches` can resolve
epoch and duration units, and pure schedules can be functions of the timestamp alone.

Example:
    >>> Time.from_str("100ba") + Time.from_str("20ba")
    Time(120, 'ba')
    >>> Timestamp(batches_per_epoch=50, max_batches=500).to_batches(Time.from_str("0.5dur"))
    250.0
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import re

from .tree import fast_replace, register_dataclass


class TimeUnit(str, enum.Enum):
    """The units a `Time` can be expressed in."""

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"


ACCEPTED_FORMS = (
    '"3ep" (epochs), "100ba" (batches), "2048sp" (samples), "1e6tok" (tokens), '
    '"0.5dur" (fraction of the run), "90sec", "2m", "1h30m", "1h30m15s" (wall clock)'
)

_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
_SIMPLE = re.compile(rf"^\s*({_NUMBER})\s*(ep|ba|sp|tok|dur|sec)\s*$")
_CLOCK = re.compile(rf"^\s*(?:({_NUMBER})h)?\s*(?:({_NUMBER})m)?\s*(?:({_NUMBER})s)?\s*$")
# Units whose amounts are naturally fractional; the counting units keep ints where they can.
_FLOAT_UNITS = ("dur", "sec")


def _as_unit(unit: TimeUnit | str) -> TimeUnit:
    """`unit` as a `TimeUnit`, or a ValueError that lists the units and accepted strings."""
    try:
        return TimeUnit(unit)
    except ValueError:
        raise ValueError(
            f"unknown time unit {unit!r}; use one of "
            f"{[u.value for u in TimeUnit]} (accepted strings: {ACCEPTED_FORMS})"
        ) from None


def _format_number(value: float) -> str:
    """The shortest text that parses back to exactly `value` ("120", "0.5", "1e-07")."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    # repr gives the shortest string that round-trips a float; "%g" would drop digits.
    return repr(value)


@dataclasses.dataclass(frozen=True, order=False)
class Time:
    """An amount of training time in one unit.

    Args:
        value: the amount (int for counts, float for "dur" and seconds).
        unit: a `TimeUnit` or its string ("ep", "ba", "sp", "tok", "dur", "sec").
    Example:
        >>> Time(3, "ep") == Time.from_str("3ep")
        True
    """

    value: float
    unit: TimeUnit

    def __post_init__(self):
        unit = _as_unit(self.unit)
        object.__setattr__(self, "unit", unit)
        value = self.value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"a Time's value must be a real number, got {value!r}; "
                f"to parse text use Time.from_str (accepted forms: {ACCEPTED_FORMS})"
            )
        if not math.isfinite(value):
            raise ValueError(f"a Time must be finite, got {value}{unit.value}")
        # Normalise numpy/torch scalars to Python numbers so equality, hashing and str are exact.
        if unit.value in _FLOAT_UNITS:
            value = float(value)
        elif isinstance(value, numbers.Integral):
            value = int(value)
        else:
            value = float(value)
            if value.is_integer():
                value = int(value)
        if value < 0:
            raise ValueError(f"a Time cannot be negative, got {value}{unit.value}")
        object.__setattr__(self, "value", value)

    @classmethod
    def from_str(cls, text: str) -> Time:
        """Parse "1ep", "100ba", "2048sp", "1e6tok", "0.5dur", "90sec", "1h30m".

        Raises:
            ValueError: naming the accepted forms when `text` matches none of them.
        """
        if not isinstance(text, str):
            raise TypeError(
                f"Time.from_str expects a string such as {ACCEPTED_FORMS}, got {text!r}"
            )
        match = _SIMPLE.match(text)
        if match:
            return cls(float(match.group(1)), _as_unit(match.group(2)))
        match = _CLOCK.match(text)
        if match and any(match.groups()) and text.strip():
            h, m, s = (float(g) if g else 0.0 for g in match.groups())
            return cls(h * 3600 + m * 60 + s, TimeUnit.SECOND)
        raise ValueError(f"cannot parse {text!r} as a Time; accepted forms: {ACCEPTED_FORMS}")

    @classmethod
    def coerce(cls, value: TimeLike) -> Time:
        """A `Time` from a `Time`, a string, or an int (taken as batches)."""
        if isinstance(value, Time):
            return value
        if isinstance(value, str):
            return cls.from_str(value)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return cls(int(value), TimeUnit.BATCH)
        raise TypeError(
            f"expected a Time, a string such as {ACCEPTED_FORMS}, or an int of batches; "
            f"got {value!r}"
        )

    def __str__(self) -> str:
        # Exact, so that Time.from_str(str(t)) == t for every unit.
        return f"{_format_number(self.value)}{self.unit.value}"

    def __repr__(self) -> str:
        return f"Time({self.value!r}, {self.unit.value!r})"

    def _same_unit(self, other: TimeLike, op: str) -> Time:
        other = Time.coerce(other)
        if other.unit is not self.unit:
            raise ValueError(
                f"cannot {op} {self} and {other}: units differ; convert both with "
                "Timestamp.to_batches first"
            )
        return other

    def __add__(self, other: TimeLike) -> Time:
        return Time(self.value + self._same_unit(other, "add").value, self.unit)

    def __sub__(self, other: TimeLike) -> Time:
        return Time(self.value - self._same_unit(other, "subtract").value, self.unit)

    def __mul__(self, factor: float) -> Time:
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
            return NotImplemented  # Python then raises a TypeError naming both types
        return Time(self.value * factor, self.unit)

    __rmul__ = __mul__

    def __truediv__(self, other: TimeLike | float) -> float | Time:
        if isinstance(other, (Time, str)):
            return self.value / self._same_unit(other, "divide").value
        return Time(self.value / other, self.unit)

    def __lt__(self, other: TimeLike) -> bool:
        return self.value < self._same_unit(other, "compare").value

    def __le__(self, other: TimeLike) -> bool:
        return self.value <= self._same_unit(other, "compare").value

    def __gt__(self, other: TimeLike) -> bool:
        return self.value > self._same_unit(other, "compare").value

    def __ge__(self, other: TimeLike) -> bool:
        return self.value >= self._same_unit(other, "compare").value


TimeLike = Time | str | int


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Timestamp:
    """The run's counters, advanced by the step (batch, sample, token) and the loop (epoch, clock).

    Fields ending in `_in_epoch` reset at each epoch. `batches_per_epoch` and `max_batches` are
    the run's horizon (0 = unknown), set by `fit`, so that epoch and duration units resolve.

    Example:
        >>> Timestamp().advance_batch(samples=32, tokens=0).batch
        1
    """

    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    elapsed_sec: float = 0.0
    batches_per_epoch: int = 0
    max_batches: int = 0

    def replace(self, **changes) -> Timestamp:
        """A copy with some fields changed."""
        return fast_replace(self, changes)

    def advance_batch(self, samples: int, tokens: int = 0) -> Timestamp:
        """The timestamp after one more batch of `samples` samples and `tokens` tokens."""
        return self.replace(
            batch=self.batch + 1,
            sample=self.sample + samples,
            token=self.token + tokens,
            batch_in_epoch=self.batch_in_epoch + 1,
            sample_in_epoch=self.sample_in_epoch + samples,
            token_in_epoch=self.token_in_epoch + tokens,
        )

    def advance_epoch(self) -> Timestamp:
        """The timestamp at the start of the next epoch."""
        return self.replace(
            epoch=self.epoch + 1, batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0
        )

    def get(self, unit: TimeUnit | str) -> float:
        """The current count in `unit` ("dur" is the fraction of `max_batches` done)."""
        unit = _as_unit(unit)
        if unit is TimeUnit.EPOCH:
            return self.epoch
        if unit is TimeUnit.BATCH:
            return self.batch
        if unit is TimeUnit.SAMPLE:
            return self.sample
        if unit is TimeUnit.TOKEN:
            return self.token
        if unit is TimeUnit.SECOND:
            return self.elapsed_sec
        return self.batch / self._need("max_batches", unit)

    def _need(self, field: str, unit: TimeUnit) -> int:
        value = getattr(self, field)
        if not value:
            raise ValueError(
                f"cannot resolve a time in {unit.value!r} units: the run's {field} is unknown; "
                "pass `duration=` to functrain.fit (or set it with "
                f"state.timestamp.replace({field}=...)), or use batch units such as '100ba'"
            )
        return value

    def to_batches(self, time: TimeLike) -> float:
        """Convert `time` to a number of batches using the horizon.

        Epochs need `batches_per_epoch`; "dur" needs `max_batches`. Samples and tokens convert
        with the average batch so far (exact for fixed-size batches).
        """
        time = Time.coerce(time)
        unit = time.unit
        if unit is TimeUnit.BATCH:
            return time.value
        if unit is TimeUnit.EPOCH:
            return time.value * self._need("batches_per_epoch", unit)
        if unit is TimeUnit.DURATION:
            return time.value * self._need("max_batches", unit)
        if unit is TimeUnit.SAMPLE and self.batch and self.sample:
            return time.value * self.batch / self.sample
        if unit is TimeUnit.TOKEN and self.batch and self.token:
            return time.value * self.batch / self.token
        if unit is TimeUnit.SECOND:
            raise ValueError(
                f"cannot convert {time} to batches: wall-clock time has no fixed number of "
                "batches; express it in batches, epochs, samples, tokens or 'dur'"
            )
        raise ValueError(
            f"cannot convert {time} to batches yet (no {unit.value} counted so far); "
            "express it in batches or epochs"
        )

    def reached(self, time: TimeLike) -> bool:
        """True once the run has trained for at least `time` (any unit)."""
        time = Time.coerce(time)
        if time.unit is TimeUnit.DURATION:
            return self.batch >= math.ceil(self.to_batches(time) - 1e-9)
        return self.get(time.unit) >= time.value
