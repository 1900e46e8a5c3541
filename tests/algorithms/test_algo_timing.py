"""timing: Composer's BATCH_END/EPOCH_END view of the timestamp inside after_update."""

import pytest

from functrain.algorithms.timing import (
    at_epoch_end,
    check_units,
    elapsed,
    epochs_completed,
    reached,
)
from functrain.units import Time, Timestamp, TimeUnit


def test_epoch_end_counts_the_epoch_the_last_batch_finished():
    mid = Timestamp(epoch=1, batch=7, batch_in_epoch=2, batches_per_epoch=5, max_batches=20)
    end = mid.replace(batch=10, batch_in_epoch=5)
    assert not at_epoch_end(mid) and epochs_completed(mid) == 1
    assert at_epoch_end(end) and epochs_completed(end) == 2
    assert elapsed(end, TimeUnit.DURATION) == 0.5 and elapsed(end, TimeUnit.BATCH) == 10
    assert reached(end, Time.from_str("2ep")) and not reached(mid, Time.from_str("2ep"))


def test_zero_times_need_no_horizon_and_errors_name_the_fix():
    assert reached(Timestamp(), Time.from_str("0.0dur"))
    with pytest.raises(ValueError, match="batches_per_epoch"):
        at_epoch_end(Timestamp(batch=3))
    with pytest.raises(ValueError, match="update_interval"):
        check_units("update_interval", Time.from_str("1dur"), (TimeUnit.BATCH,))
