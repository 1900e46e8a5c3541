"""Interval (a pure question), Trigger (its memory) and LogCadence: when callbacks act."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.callbacks.interval import Interval, LogCadence, Trigger
from functrain.loop.horizon import Every
from functrain.units import Time, Timestamp


@settings(max_examples=40, deadline=None)
@given(every=st.integers(1, 12), batches=st.integers(1, 60))
def test_batch_interval_fires_on_multiples(every, batches):
    trigger = Trigger(f"{every}ba")
    fired = [b for b in range(1, batches + 1) if trigger.due(Timestamp(batch=b))]
    assert fired == [b for b in range(1, batches + 1) if b % every == 0]


@settings(max_examples=30, deadline=None)
@given(
    text=st.sampled_from(["1ba", "3ba", "0.5ep", "2ep", "0.25dur", "0.1dur", "64sp"]),
    bpe=st.integers(2, 9),
)
def test_fires_on_the_same_batches_as_the_loop(text, bpe):
    """Callbacks that follow the loop's log interval log on exactly the loop's logging steps."""
    interval = Time.from_str(text)
    loop, ours = Every(interval), Trigger(interval)
    for batch in range(1, 4 * bpe + 1):
        ts = Timestamp(batch=batch, sample=8 * batch, batches_per_epoch=bpe, max_batches=4 * bpe)
        if not loop.by_epoch:
            assert ours.due(ts) == loop.at_batch_end(ts), (text, bpe, batch)


def test_epoch_interval_fires_at_the_last_batch_of_each_epoch():
    trigger = Trigger("1ep")
    fired = [b for b in range(1, 16) if trigger.due(Timestamp(batch=b, batches_per_epoch=5))]
    assert fired == [5, 10, 15]


def test_fires_at_most_once_per_batch():
    trigger = Trigger("1ba")
    assert trigger.due(Timestamp(batch=3))
    assert not trigger.due(Timestamp(batch=3))


def test_seconds_interval_reads_the_runs_agreed_clock():
    """A "sec" interval reads `Timestamp.elapsed_sec` (the clock the ranks agree on), never the
    process's own: the same timestamps give the same firings whatever the process's clock does."""
    trigger = Trigger("30sec")
    fired = [b for b in range(1, 11) if trigger.due(Timestamp(batch=b, elapsed_sec=10.0 * b))]
    assert fired == [4, 7, 10]  # the clock starts at the first batch seen
    every = Interval("30sec")
    assert every.due(Timestamp(batch=5, elapsed_sec=45.0), Interval.start(15.0)) == (
        True,
        (5, 45.0),
    )
    assert every.due(Timestamp(batch=5, elapsed_sec=44.0), Interval.start(15.0))[0] is False


@settings(max_examples=60, deadline=None)
@given(
    text=st.sampled_from(["1ba", "3ba", "0.5ep", "1ep", "0.25dur", "64sp", "5sec", "30sec"]),
    steps=st.lists(st.tuples(st.integers(0, 2), st.floats(0.0, 20.0)), min_size=1, max_size=40),
)
def test_interval_is_pure_and_the_trigger_is_its_fold(text, steps):
    """Asking twice with the same memory gives the same answer; a Trigger is Interval.due folded
    over the batches it is asked about (and fires at most once per batch)."""
    every, trigger, last = Interval(text), Trigger(text), None
    batch, clock = 0, 0.0
    for advance, seconds in steps:
        batch, clock = batch + advance, clock + seconds
        ts = Timestamp(batch=batch, sample=8 * batch, batches_per_epoch=4, max_batches=64,
                       elapsed_sec=clock)  # fmt: skip
        answer = every.due(ts, last)
        assert every.due(ts, last) == answer
        assert trigger.due(ts) == answer[0]
        if answer[0]:
            assert not every.due(ts, answer[1])[0]
        last = answer[1]


@pytest.mark.parametrize("bad", ["0ba", "ten batches", -1])
def test_bad_intervals_are_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        Interval(bad)
    with pytest.raises((ValueError, TypeError)):
        Trigger(bad)


def test_epoch_interval_waits_for_the_horizon():
    """Data without a length: nothing fires until the loop has learnt the epoch's size."""
    trigger = Trigger("1ep")
    assert not any(trigger.due(Timestamp(batch=b)) for b in range(1, 8))
    assert trigger.due(Timestamp(batch=14, batches_per_epoch=7))


class _Ctx:
    def __init__(self, batch, **attrs):
        self.timestamp = Timestamp(batch=batch)
        self.__dict__.update(attrs)


def test_cadence_follows_the_loop_interval():
    cadence = LogCadence()
    fired = [b for b in range(1, 13) if cadence.due(_Ctx(b, log_interval=Time(4, "ba")))]
    assert fired == [4, 8, 12]


def test_cadence_explicit_interval_wins():
    cadence = LogCadence("3ba")
    fired = [b for b in range(1, 10) if cadence.due(_Ctx(b, log_interval=Time(1, "ba")))]
    assert fired == [3, 6, 9]


def test_cadence_is_silent_when_the_loop_never_logs():
    assert not any(LogCadence().due(_Ctx(b, log_interval=None)) for b in range(1, 30))
    fallback = LogCadence(when_loop_silent="5ba")
    assert [b for b in range(1, 11) if fallback.due(_Ctx(b, log_interval=None))] == [5, 10]


def test_cadence_without_loop_attribute_uses_fit_default():
    cadence = LogCadence()
    assert [b for b in range(1, 31) if cadence.due(_Ctx(b))] == [10, 20, 30]
