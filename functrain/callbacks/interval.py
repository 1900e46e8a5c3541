"""When a callback acts: `Interval`, a "is it time yet?" test on the run's `Timestamp`.

Callbacks that log (speed, memory, norms, ...) act on the loop's logging steps by default, so their
numbers land in the same log lines as the loss. A callback can be given its own interval instead
("25ba", "1ep", "0.1dur", "30sec"); at most one action per batch, and nothing here ever touches a
device tensor.

Example:
    >>> every = Interval("2ba")
    >>> [every.due(Timestamp(batch=b)) for b in (1, 2, 3, 4)]
    [False, True, False, True]
"""

from __future__ import annotations

import time
from typing import Any

from ..units import Time, TimeLike, Timestamp, TimeUnit

# The loop's default `log_interval` (functrain.fit); used when the context does not say.
DEFAULT_LOG_INTERVAL = "10ba"


class Interval:
    """A periodic trigger on the training timestamp.

    Args:
        interval: a `Time` or string ("10ba", "1ep", "0.05dur", "2048sp", "30sec"), or an int of
            batches.
    Example:
        >>> Interval("1ep").due(Timestamp(batch=10, batches_per_epoch=5))
        True
    """

    def __init__(self, interval: TimeLike):
        self.interval = Time.coerce(interval)
        if self.interval.value <= 0:
            raise ValueError(f"an interval must be positive, got {self.interval}")
        self._last_batch = -1
        self._last_clock: float | None = None

    def due(self, timestamp: Timestamp) -> bool:
        """True when `timestamp` falls on the interval (at most once per batch)."""
        if timestamp.batch == self._last_batch:
            return False
        if self.interval.unit is TimeUnit.SECOND:
            now = time.monotonic()
            if self._last_clock is None:
                self._last_clock = now  # the clock starts at the first batch seen
                return False
            if now - self._last_clock < self.interval.value:
                return False
            self._last_clock = now
        else:
            try:  # rounded as the loop rounds its own intervals, so both fire on the same steps
                every = max(1, round(timestamp.to_batches(self.interval)))
            except ValueError:  # samples/tokens before any was counted
                return False
            if timestamp.batch % every:
                return False
        self._last_batch = timestamp.batch
        return True


class LogCadence:
    """An `Interval` that defaults to the loop's logging interval.

    With `interval=None` it follows `ctx.log_interval` (the `log_interval` given to `fit`); when
    the loop does not log at all (`log_interval=None`) it uses `when_loop_silent` (None: never
    due). A context without the attribute (a hand-made one) gets `"10ba"`, fit's default.

    Args:
        interval: None (follow the loop) or a `TimeLike`.
        when_loop_silent: the interval to use when the loop itself never logs.
    Example:
        >>> LogCadence("5ba").due(ctx)  # ctx: the loop's Context at BATCH_END  # doctest: +SKIP
    """

    def __init__(self, interval: TimeLike | None = None, when_loop_silent: TimeLike | None = None):
        self.explicit = interval
        self.when_loop_silent = when_loop_silent
        self._interval = Interval(interval) if interval is not None else None
        self._followed: Any = _UNSET

    def due(self, ctx: Any) -> bool:
        """True when `ctx.timestamp` is a step to act on."""
        if self.explicit is None:
            loop_interval = getattr(ctx, "log_interval", DEFAULT_LOG_INTERVAL)
            if loop_interval is None:
                loop_interval = self.when_loop_silent
            if loop_interval != self._followed:
                self._interval = Interval(loop_interval) if loop_interval is not None else None
                self._followed = loop_interval
        return self._interval is not None and self._interval.due(ctx.timestamp)


_UNSET = object()
