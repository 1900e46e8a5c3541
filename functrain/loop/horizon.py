"""The run's horizon for `fit`: its duration and intervals, its length in batches, when it ends.

`fit` takes its duration and its eval/log intervals as `TimeLike`s ("3ep", "500ba", "0.25dur",
"30sec"). They are parsed here with errors that name the argument, and turned into the two numbers
the loop counts in: the batches per epoch (from the data, or learnt at the end of the first epoch
when the data has no length) and `max_batches`, the run's length in batches (0 while unknown, as
for wall-clock durations). `Every` decides whether an interval falls on a batch or epoch end.

Example:
    >>> duration = parse_time("2ep", "duration")
    >>> max_batches_for(duration, batches_per_epoch=50, timestamp=Timestamp(), data=None)
    100
    >>> Every(parse_time("10ba", "log_interval")).at_batch_end(Timestamp(batch=20))
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..callbacks.interval import Interval, Last
from ..data import DataSource, Loader
from ..units import Time, Timestamp, TimeUnit


def parse_time(value: Any, what: str, allow_none: bool = False) -> Time | None:
    """`value` as a positive `Time`, or a ValueError naming `fit`'s argument `what`.

    Args:
        value: a `TimeLike` ("3ep", "500ba", a `Time`, ...), or None when `allow_none`.
        what: the name of `fit`'s argument, for the error message.
        allow_none: whether None is allowed (it is returned as is).
    Returns:
        the parsed `Time` (or None).
    Example:
        >>> parse_time("0.5dur", "eval_interval")
        Time(0.5, 'dur')
    """
    if value is None and allow_none:
        return None
    try:
        parsed = Time.coerce(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"fit({what}={value!r}): {error}") from None
    if parsed.value <= 0:
        raise ValueError(f"fit({what}={value!r}): must be positive")
    return parsed


class Every:
    """Whether an interval falls on a batch end or an epoch end.

    Whole epochs fire at the end of the epoch; every other unit fires on the batches that are
    multiples of the interval in batches (rounded, at least 1), wall-clock intervals once the
    run's clock (`Timestamp.elapsed_sec`) has advanced that much since the last firing.

    Args:
        interval: the parsed interval; None: never.
    Example:
        >>> Every(Time(2, TimeUnit.BATCH)).at_batch_end(Timestamp(batch=4))
        True
    """

    def __init__(self, interval: Time | None):
        self.interval = interval
        # The same pure question the callbacks ask (their Trigger), on the run's agreed clock.
        self._due = Interval(interval) if interval is not None else None
        self._last: Last = None

    def start(self, elapsed_sec: float) -> None:
        """Count wall-clock intervals from `elapsed_sec`, the run's clock when `fit` starts."""
        self._last = Interval.start(elapsed_sec)

    @property
    def by_epoch(self) -> bool:
        """True for a whole number of epochs (due at epoch ends, not at batch ends)."""
        interval = self.interval
        return (
            interval is not None
            and interval.unit is TimeUnit.EPOCH
            and float(interval.value).is_integer()
        )

    def at_batch_end(self, ts: Timestamp) -> bool:
        """True when the batch that ended at `ts` is due."""
        interval = self.interval
        if interval is None:
            return False
        if self.by_epoch:  # the batch that completes a due epoch
            bpe = ts.batches_per_epoch
            return (
                bool(bpe) and ts.batch_in_epoch == bpe and (ts.epoch + 1) % int(interval.value) == 0
            )
        # Wall-clock intervals read the run's clock (`elapsed_sec`), which every rank agrees on,
        # and not this process's own: an evaluation is collective, so all ranks must fire.
        assert self._due is not None
        fired, self._last = self._due.due(ts, self._last)
        return fired

    def at_epoch_end(self, ts: Timestamp) -> bool:
        """True when the epoch that ended at `ts` (already advanced to the next) is due."""
        interval = self.interval
        return self.by_epoch and interval is not None and ts.epoch % int(interval.value) == 0


def data_batches_per_epoch(source: DataSource) -> int:
    """Batches per epoch of the training data (0 when it has no length), checked for use.

    Args:
        source: `fit`'s view of the training data.
    Returns:
        the number of batches per epoch on this rank, or 0 when the data has no length.
    Raises:
        ValueError: the data is empty, or a `Loader` with `drop_last=False` whose last batch
            cannot be split over the ranks.
    Example:
        >>> data_batches_per_epoch(DataSource([1, 2, 3]))
        3
    """
    data = source.data
    if isinstance(data, Loader):
        bpe = data.num_batches
        if data.world_size > 1 and not data.drop_last:
            last = data.num_samples % data.batch_size
            if last % data.world_size:
                raise ValueError(
                    f"training on {data.world_size} ranks with drop_last=False: the last "
                    f"batch of {last} samples cannot be split evenly over the ranks; use "
                    "Loader(..., drop_last=True) for training"
                )
    else:
        bpe = source.batches_per_epoch()
    if bpe == 0 and _has_len(data):
        raise ValueError(
            "train_data is empty (0 batches per epoch): check the dataset's length, and "
            "that batch_size is not larger than the dataset with drop_last=True"
        )
    return bpe


def max_batches_for(duration: Time, batches_per_epoch: int, timestamp: Timestamp, data: Any) -> int:
    """The run's length in batches for `duration`, or 0 while it cannot be known.

    Args:
        duration: the run's total length (not a fraction of itself).
        batches_per_epoch: batches per epoch (0: unknown).
        timestamp: the run's position (samples/tokens convert at the rate counted so far).
        data: the training data (a `Loader` converts samples exactly from its batch size).
    Returns:
        the number of batches; 0 for wall-clock durations, and for tokens (or epochs of data
        without a length) before they can be counted.
    Raises:
        ValueError: a fractional number of epochs on data without a length.
    Example:
        >>> max_batches_for(Time(0.5, TimeUnit.EPOCH), 10, Timestamp(), None)
        5
    """
    if duration.unit is TimeUnit.BATCH:
        return int(math.ceil(duration.value))
    if duration.unit is TimeUnit.EPOCH:
        if batches_per_epoch:
            return int(math.ceil(duration.value * batches_per_epoch - 1e-9)) + _epoch_offset(
                timestamp, batches_per_epoch
            )
        if not float(duration.value).is_integer():
            raise ValueError(
                f"fit(duration={duration}): a fractional number of epochs needs data with a "
                "length; use batches instead"
            )
        return 0
    if duration.unit is TimeUnit.SAMPLE and isinstance(data, Loader):
        return int(math.ceil(duration.value / data.batch_size))
    if duration.unit in (TimeUnit.SAMPLE, TimeUnit.TOKEN) and timestamp.batch:
        return int(math.ceil(timestamp.to_batches(duration) - 1e-9))
    return 0  # tokens before the first batch, wall-clock time: estimated or unknown


def _epoch_offset(ts: Timestamp, batches_per_epoch: int) -> int:
    """Batches trained before this epoch beyond `epoch * batches_per_epoch`: nonzero only after
    the epoch length changed under a deliberate resume (`fit(on_data_change=...)`), so that
    the remaining epochs are counted at the new length."""
    return ts.batch - ts.batch_in_epoch - ts.epoch * batches_per_epoch


def estimated_horizon(duration: Time, ts: Timestamp) -> Timestamp | None:
    """Samples/tokens durations: `ts` with `max_batches` fixed at the rate counted so far, or
    None when there is nothing to fix (already known, another unit, nothing counted yet).

    Example:
        >>> estimated_horizon(Time(100, TimeUnit.SAMPLE), Timestamp(batch=2, sample=16))
        ... # doctest: +SKIP
        Timestamp(batch=2, sample=16, max_batches=13, ...)
    """
    if ts.max_batches or duration.unit not in (TimeUnit.SAMPLE, TimeUnit.TOKEN):
        return None
    try:
        estimate = int(math.ceil(ts.to_batches(duration) - 1e-9))
    except ValueError:
        return None
    return ts.replace(max_batches=estimate)


def check_fraction_intervals(
    duration: Time, max_batches: int, intervals: Mapping[str, Time | None]
) -> None:
    """Refuse intervals that are a fraction of the run ("0.1dur") when its length is unknown.

    Args:
        duration: the run's duration.
        max_batches: the run's length in batches (0: unknown).
        intervals: `{fit's argument name: parsed interval or None}`.
    Raises:
        ValueError: naming the interval, when neither `max_batches` nor a samples/tokens
            duration (estimated after the first batch) gives the run's length.
    Example:
        >>> check_fraction_intervals(Time(3, TimeUnit.EPOCH), 300, {"eval_interval": None})
    """
    for what, interval in intervals.items():
        unit = interval.unit if interval is not None else None
        if (
            unit is TimeUnit.DURATION
            and not max_batches
            and duration.unit not in (TimeUnit.SAMPLE, TimeUnit.TOKEN)
        ):
            raise ValueError(
                f"fit({what}={str(interval)!r}): a fraction of the run needs a known "
                f"run length, but duration={str(duration)!r} gives none for this data; "
                "use batches or epochs"
            )


def run_finished(duration: Time, timestamp: Timestamp) -> bool:
    """True once the run at `timestamp` has trained for `duration`.

    Batches and epochs compare against `max_batches` when it is known, so that a fractional
    number of epochs ends on the batch `max_batches_for` computed.

    Example:
        >>> run_finished(Time(2, TimeUnit.BATCH), Timestamp(batch=2, max_batches=2))
        True
    """
    if duration.unit in (TimeUnit.BATCH, TimeUnit.EPOCH) and timestamp.max_batches:
        return timestamp.batch >= timestamp.max_batches
    return timestamp.reached(duration)


def _has_len(data: Any) -> bool:
    try:
        len(data)
    except TypeError:
        return False
    return True
