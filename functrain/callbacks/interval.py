"""When a callback acts: `Interval`, a pure "is it time yet?" question on the run's `Timestamp`,
and `Trigger`, which remembers its answers for a callback.

Callbacks that log (speed, memory, norms, ...) act on the loop's logging steps by default, so their
numbers land in the same log lines as the loss. A callback can be given its own interval instead
("25ba", "1ep", "0.1dur", "30sec"); at most one action per batch, and nothing here ever touches a
device tensor.

Wall-clock intervals ("30sec") read the run's clock, `Timestamp.elapsed_sec`, which every rank
agrees on (`functrain.loop.agreement`), never this process's own clock: a callback that issues a
collective when it is due (ActivationMonitor, OptimizerMonitor) then enters it on the same step on
every rank, however their clocks drift. `fit`'s own eval and log cadence asks the same `Interval`.

Example:
    >>> every = Interval("2ba")
    >>> fired, last = every.due(Timestamp(batch=2), None)
    >>> fired, every.due(Timestamp(batch=2), last)[0]
    (True, False)
    >>> trigger = Trigger("2ba")
    >>> [trigger.due(Timestamp(batch=b)) for b in (1, 2, 3, 4)]
    [False, True, False, True]
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..units import Time, TimeLike, Timestamp, TimeUnit

__all__ = ["DEFAULT_LOG_INTERVAL", "Interval", "Last", "LogCadence", "Trigger"]

# The loop's default `log_interval` (functrain.fit); used when the context does not say.
DEFAULT_LOG_INTERVAL = "10ba"

# What an interval remembers between questions: (the batch it last fired at, the run's clock
# then), or None before the first question. A wall-clock interval counts from that clock.
Last = tuple[int, float] | None


@dataclasses.dataclass(frozen=True)
class Interval:
    """A periodic condition on the training timestamp, as a pure value.

    Args:
        every: a `Time` or string ("10ba", "1ep", "0.05dur", "2048sp", "30sec"), or an int of
            batches; parsed into a `Time`.
    Raises:
        ValueError: the interval is not positive (or not an interval).
    Example:
        >>> Interval("1ep").due(Timestamp(batch=10, batches_per_epoch=5), None)[0]
        True
    """

    every: Time

    def __init__(self, every: TimeLike):
        parsed = Time.coerce(every)
        if parsed.value <= 0:
            raise ValueError(f"an interval must be positive, got {parsed}")
        object.__setattr__(self, "every", parsed)

    @staticmethod
    def start(elapsed_sec: float) -> Last:
        """The memory of an interval counted from the run's clock `elapsed_sec` (fit's start)."""
        return (-1, elapsed_sec)

    def due(self, timestamp: Timestamp, last: Last) -> tuple[bool, Last]:
        """Whether the batch that ended at `timestamp` is due, and what to remember.

        Args:
            timestamp: the run's position (its `elapsed_sec` is the agreed clock).
            last: what the previous question returned (None: none was asked; a wall-clock
                interval then starts counting at this batch).
        Returns:
            `(due, last)`: at most one True per batch.
        """
        last_batch, last_clock = last if last is not None else (-1, None)
        if timestamp.batch == last_batch:
            return False, last
        now = timestamp.elapsed_sec
        if self.every.unit is TimeUnit.SECOND:
            if last_clock is None:
                return False, (last_batch, now)  # the clock starts at the first batch seen
            if now - last_clock < self.every.value:
                return False, last
            return True, (timestamp.batch, now)
        try:  # rounded as the loop rounds its own intervals, so both fire on the same steps
            every = max(1, round(timestamp.to_batches(self.every)))
        except ValueError:  # samples/tokens before any was counted
            return False, last
        if timestamp.batch % every:
            return False, last
        return True, (timestamp.batch, now)


class Trigger:
    """An `Interval` with its memory: `due(timestamp) -> bool`, for a callback.

    Args:
        interval: a `Time` or string ("10ba", "1ep", "0.05dur", "2048sp", "30sec"), or an int of
            batches.
    Example:
        >>> Trigger("1ep").due(Timestamp(batch=10, batches_per_epoch=5))
        True
    """

    def __init__(self, interval: TimeLike):
        self.interval = Interval(interval)
        self.last: Last = None

    def due(self, timestamp: Timestamp) -> bool:
        """True when `timestamp` falls on the interval (at most once per batch)."""
        fired, self.last = self.interval.due(timestamp, self.last)
        return fired


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
        self._interval = Trigger(interval) if interval is not None else None
        self._followed: Any = _UNSET

    def due(self, ctx: Any) -> bool:
        """True when `ctx.timestamp` is a step to act on."""
        if self.explicit is None:
            loop_interval = getattr(ctx, "log_interval", DEFAULT_LOG_INTERVAL)
            if loop_interval is None:
                loop_interval = self.when_loop_silent
            if loop_interval != self._followed:
                self._interval = Trigger(loop_interval) if loop_interval is not None else None
                self._followed = loop_interval
        return self._interval is not None and self._interval.due(ctx.timestamp)


_UNSET = object()
