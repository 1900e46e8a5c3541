"""Reading the run's time inside `after_update` (the step's BATCH_END) and `update`.

By `after_update` the step has already counted the batch it just trained on, so "the end of an
epoch" is the last batch of it (`batch_in_epoch == batches_per_epoch`); the loop advances the
epoch counter only afterwards. These helpers turn that into Composer's event semantics.

Example:
    >>> ts = Timestamp(batch=10, batch_in_epoch=5, batches_per_epoch=5)
    >>> at_epoch_end(ts), epochs_completed(ts)
    (True, 1)
"""

from __future__ import annotations

from ..units import Time, Timestamp, TimeUnit


def at_epoch_end(ts: Timestamp) -> bool:
    """True when the batch just trained was the last of its epoch (needs `batches_per_epoch`)."""
    if not ts.batches_per_epoch:
        raise ValueError(
            "this algorithm acts at epoch ends, but the run's batches_per_epoch is unknown; "
            "train with functrain.fit (which sets it) or give times in batches such as '100ba'"
        )
    return ts.batch_in_epoch >= ts.batches_per_epoch


def epochs_completed(ts: Timestamp) -> int:
    """Epochs finished, counting the one the last batch completed."""
    return ts.epoch + int(at_epoch_end(ts))


def elapsed(ts: Timestamp, unit: TimeUnit) -> float:
    """How much of the run has passed, in `unit` ("dur": a fraction of `max_batches`)."""
    if unit is TimeUnit.EPOCH:
        return epochs_completed(ts)
    return ts.get(unit)


def reached(ts: Timestamp, time: Time) -> bool:
    """True once `time` has passed (a zero time is always reached, even with an unknown horizon)."""
    if time.value == 0:
        return True
    return elapsed(ts, time.unit) >= time.value


def check_units(name: str, time: Time, allowed: tuple[TimeUnit, ...]) -> Time:
    """`time`, or a ValueError naming the parameter and the units it accepts."""
    if time.unit not in allowed:
        raise ValueError(f"{name} must be in units of {[u.value for u in allowed]}, got {time}")
    return time
