"""The run's horizon: duration/interval parsing, max_batches, when intervals fall, when runs end."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.data import DataSource, Loader
from functrain.loop.horizon import (
    Every,
    check_fraction_intervals,
    data_batches_per_epoch,
    estimated_horizon,
    max_batches_for,
    parse_time,
    run_finished,
)
from functrain.units import Time, Timestamp, TimeUnit


def _dataset(n):
    return torch.utils.data.TensorDataset(torch.arange(n, dtype=torch.float32))


# -- parse_time ---------------------------------------------------------------------------------


def test_parse_time_accepts_strings_and_times():
    assert parse_time("3ep", "duration") == Time(3, TimeUnit.EPOCH)
    assert parse_time(Time(5, TimeUnit.BATCH), "duration") == Time(5, TimeUnit.BATCH)
    assert parse_time(None, "eval_interval", allow_none=True) is None


@pytest.mark.parametrize("bad", ["ten batches", "0ba", "-2ep", None, 3.5j])
def test_parse_time_errors_name_the_argument(bad):
    with pytest.raises(ValueError, match=r"fit\(log_interval="):
        parse_time(bad, "log_interval")


# -- Every --------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(every=st.integers(1, 9), batches=st.integers(1, 40))
def test_batch_intervals_fire_on_multiples(every, batches):
    due = Every(Time(every, TimeUnit.BATCH))
    fired = [b for b in range(1, batches + 1) if due.at_batch_end(Timestamp(batch=b))]
    assert fired == [b for b in range(1, batches + 1) if b % every == 0]
    assert not due.by_epoch


def test_whole_epochs_fire_on_the_epochs_last_batch_and_at_epoch_end():
    due = Every(Time(2, TimeUnit.EPOCH))
    assert due.by_epoch
    bpe = 4
    fired = []
    for epoch in range(4):
        for in_epoch in range(1, bpe + 1):
            ts = Timestamp(
                epoch=epoch, batch=epoch * bpe + in_epoch, batch_in_epoch=in_epoch,
                batches_per_epoch=bpe,
            )  # fmt: skip
            if due.at_batch_end(ts):
                fired.append(ts.batch)
    assert fired == [8, 16]  # the last batches of epochs 2 and 4
    assert [e for e in range(1, 7) if due.at_epoch_end(Timestamp(epoch=e))] == [2, 4, 6]


def test_fractional_epochs_are_batch_intervals():
    due = Every(Time(0.5, TimeUnit.EPOCH))
    assert not due.by_epoch and not due.at_epoch_end(Timestamp(epoch=1))
    ts = [Timestamp(batch=b, batches_per_epoch=10) for b in range(1, 21)]
    assert [t.batch for t in ts if due.at_batch_end(t)] == [5, 10, 15, 20]


def test_none_never_fires_and_samples_wait_for_a_count():
    assert not Every(None).at_batch_end(Timestamp(batch=10))
    assert not Every(None).by_epoch
    samples = Every(Time(64, TimeUnit.SAMPLE))
    assert not samples.at_batch_end(Timestamp(batch=1))  # no sample counted yet: no rate
    assert samples.at_batch_end(Timestamp(batch=2, sample=64))


def test_seconds_intervals_follow_the_runs_clock():
    # The run's own clock (elapsed_sec, agreed by all ranks), not this process's: 10 s a batch.
    due = Every(Time(30, TimeUnit.SECOND))
    due.start(100.0)
    fired = [
        b for b in range(1, 11) if due.at_batch_end(Timestamp(batch=b, elapsed_sec=100.0 + 10 * b))
    ]
    assert fired == [3, 6, 9]
    # ...so two ranks whose processes were started apart fire on the same batches
    other = Every(Time(30, TimeUnit.SECOND))
    other.start(100.0)
    assert [
        b
        for b in range(1, 11)
        if other.at_batch_end(Timestamp(batch=b, elapsed_sec=100.0 + 10 * b))
    ] == fired


# -- data_batches_per_epoch ---------------------------------------------------------------------


def test_batches_per_epoch_of_sized_and_unsized_data():
    assert data_batches_per_epoch(DataSource([1, 2, 3])) == 3
    assert data_batches_per_epoch(DataSource(Loader(_dataset(10), 3, drop_last=False))) == 4
    assert data_batches_per_epoch(DataSource(iter([1, 2]))) == 0  # no length


def test_empty_data_is_refused():
    with pytest.raises(ValueError, match="train_data is empty"):
        data_batches_per_epoch(DataSource([]))


def test_an_uneven_last_batch_over_ranks_is_refused():
    loader = Loader(_dataset(9), 4, drop_last=False, rank=0, world_size=2)
    with pytest.raises(ValueError, match="drop_last=True"):
        data_batches_per_epoch(DataSource(loader))


# -- max_batches_for ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "duration, bpe, ts, expected",
    [
        ("7ba", 0, Timestamp(), 7),
        ("2ep", 5, Timestamp(), 10),
        ("0.5ep", 5, Timestamp(), 3),  # rounded up: the run covers at least the duration
        ("3ep", 0, Timestamp(), 0),  # unknown until the first epoch ends
        ("100sp", 0, Timestamp(batch=2, sample=16), 13),  # at the rate counted so far
        ("1e3tok", 0, Timestamp(), 0),  # tokens before the first batch
        ("1e3tok", 0, Timestamp(batch=4, token=400), 10),
        ("30sec", 10, Timestamp(batch=3), 0),  # wall-clock time: unknown
    ],
)
def test_max_batches_in_every_unit(duration, bpe, ts, expected):
    assert max_batches_for(Time.from_str(duration), bpe, ts, data=None) == expected


def test_samples_convert_with_a_loaders_batch_size():
    loader = Loader(_dataset(64), 8)
    assert max_batches_for(Time(100, TimeUnit.SAMPLE), 8, Timestamp(), loader) == 13


def test_fractional_epochs_need_a_length():
    with pytest.raises(ValueError, match="use batches instead"):
        max_batches_for(Time(1.5, TimeUnit.EPOCH), 0, Timestamp(), data=None)


# -- check_fraction_intervals and run_finished ---------------------------------------------------


def test_fraction_intervals_need_a_run_length():
    dur = Time(0.25, TimeUnit.DURATION)
    check_fraction_intervals(Time(2, TimeUnit.EPOCH), 20, {"eval_interval": dur})
    check_fraction_intervals(Time(100, TimeUnit.SAMPLE), 0, {"eval_interval": dur})  # estimated
    check_fraction_intervals(Time(60, TimeUnit.SECOND), 0, {"log_interval": None})
    with pytest.raises(ValueError, match=r"fit\(log_interval='0.25dur'\).*duration='60sec'"):
        check_fraction_intervals(Time(60, TimeUnit.SECOND), 0, {"log_interval": dur})


def test_run_finished_counts_batches_against_max_batches():
    three_epochs = Time(3, TimeUnit.EPOCH)
    assert not run_finished(three_epochs, Timestamp(batch=14, epoch=2, max_batches=15))
    assert run_finished(three_epochs, Timestamp(batch=15, epoch=2, max_batches=15))
    # unknown length: the epoch counter decides
    assert run_finished(three_epochs, Timestamp(batch=9, epoch=3))
    assert not run_finished(Time(1000, TimeUnit.SAMPLE), Timestamp(batch=9, sample=999))
    assert run_finished(Time(1000, TimeUnit.SAMPLE), Timestamp(batch=10, sample=1000))


def test_epochs_after_a_changed_epoch_length_count_at_the_new_length():
    two = parse_time("2ep", "duration")
    # a consistent position (3 epochs of 10 so far): the plain product
    assert max_batches_for(two, 10, Timestamp(epoch=1, batch=14, batch_in_epoch=4), None) == 20
    # 35 batches trained, epoch 0 restarted on data of 20 batches: 35 + 2 epochs of 20
    assert max_batches_for(two, 20, Timestamp(epoch=0, batch=35), None) == 75
    # 54 batches were epoch 0 at batch size 12; epoch 1 at 24 has 27 batches: 54 + 27
    assert max_batches_for(two, 27, Timestamp(epoch=1, batch=54), None) == 81


def test_a_samples_duration_is_estimated_after_the_first_counted_batch():
    samples = parse_time("100sp", "duration")
    assert estimated_horizon(samples, Timestamp()) is None  # nothing counted yet
    assert estimated_horizon(samples, Timestamp(batch=2, sample=16)).max_batches == 13
    assert estimated_horizon(parse_time("2ep", "duration"), Timestamp(batch=2, sample=16)) is None
