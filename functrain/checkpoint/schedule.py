"""When a `Manager` saves: `SaveSchedule`, a pure question about a run's position.

The schedule counts how many intervals of `every` a timestamp has completed (its *index*); a save
is due when that index is past the index of the last save (or restore). Asking never changes
anything: the manager records the index of what it saved, so asking twice at one moment gives
the same answer, and a restored run does not save again at the position it resumed from.

Example:
    >>> schedule = SaveSchedule.parse("3ba")
    >>> [b for b in range(1, 8) if schedule.due(Timestamp(batch=b), last=None)]
    [3, 4, 5, 6, 7]
    >>> schedule.due(Timestamp(batch=4), last=schedule.index(Timestamp(batch=3)))
    False
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..units import Time, Timestamp, TimeUnit

# Positions land on a multiple up to float rounding ("0.1dur" of 30 batches is 3.0000000004).
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class SaveSchedule:
    """Save every `every` of a run (None: only when asked).

    Args:
        every: the interval as a `Time` ("1ep", "500ba", "0.1dur"), or None.
    Example:
        >>> SaveSchedule.parse("1ep").index(Timestamp(epoch=2))
        2
    """

    every: Time | None = None

    @classmethod
    def parse(cls, value: Any) -> SaveSchedule:
        """A schedule from what `Manager(every=...)` accepts, refusing intervals that would never
        (or always) save.

        Args:
            value: a `Time`, a string such as "1ep", an int of batches, or None.
        Returns:
            the schedule.
        Raises:
            TypeError, ValueError: `value` is not an interval that can be saved on.
        """
        if value is None:
            return cls(None)
        if isinstance(value, bool):
            raise TypeError(
                f"every must be a Time, a string such as '1ep' or an int, got {value!r}"
            )
        every = Time.coerce(value)
        if not (math.isfinite(every.value) and every.value > 0):
            raise ValueError(
                f"every={value!r} would never save: give a positive interval such as '1ep', "
                "'500ba' or '0.1dur', or every=None to save only when Manager.save is called"
            )
        if every.unit is TimeUnit.DURATION and every.value > 1:
            raise ValueError(
                f"every={value!r} is longer than the run (a fraction of it is at most 1dur); "
                "use e.g. '0.25dur', or every=None"
            )
        return cls(every)

    def index(self, timestamp: Timestamp) -> int | None:
        """How many intervals `timestamp` has completed; None without an interval (or while a
        fraction of the run cannot be measured: its length is unknown)."""
        every = self.every
        if every is None:
            return None
        if every.unit is TimeUnit.DURATION:
            count, period = float(timestamp.batch), float(timestamp.to_batches(every))
        else:
            count, period = float(timestamp.get(every.unit)), float(every.value)
        if period <= 0:
            return None
        return max(0, math.floor(count / period + _EPS))

    def due(self, timestamp: Timestamp, last: int | None) -> bool:
        """True when `timestamp` has completed an interval past `last`.

        Args:
            timestamp: the run's position.
            last: the index of the last save or restore (`index` of its timestamp); None when
                there was none, so that the first interval of the run counts.
        Returns:
            whether a save is due.
        """
        index = self.index(timestamp)
        return index is not None and index > (0 if last is None else last)


__all__ = ["SaveSchedule"]
