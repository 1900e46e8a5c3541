"""Interval and LogCadence: when callbacks act."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.callbacks import interval as interval_lib
from functrain.callbacks.interval import Interval, LogCadence
from functrain.loop.horizon import Every
from functrain.units import Time, Timestamp


@settings(max_examples=40, deadline=None)
@given(every=st.integers(1, 12), batches=st.integers(1, 60))
def test_batch_interval_fires_on_multiples(every, batches):
    trigger = Interval(f"{every}ba")
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
    loop, ours = Every(interval), Interval(interval)
    for batch in range(1, 4 * bpe + 1):
        ts = Timestamp(batch=batch, sample=8 * batch, batches_per_epoch=bpe, max_batches=4 * bpe)
        if not loop.by_epoch:
            assert ours.due(ts) == loop.at_batch_end(ts), (text, bpe, batch)


def test_epoch_interval_fires_at_the_last_batch_of_each_epoch():
    trigger = Interval("1ep")
    fired = [b for b in range(1, 16) if trigger.due(Timestamp(batch=b, batches_per_epoch=5))]
    assert fired == [5, 10, 15]


def test_fires_at_most_once_per_batch():
    trigger = Interval("1ba")
    assert trigger.due(Timestamp(batch=3))
    assert not trigger.due(Timestamp(batch=3))


def test_seconds_interval_uses_the_clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(interval_lib.time, "monotonic", lambda: now[0])
    trigger = Interval("30sec")
    fired = []
    for batch in range(1, 11):
        now[0] += 10.0
        if trigger.due(Timestamp(batch=batch)):
            fired.append(batch)
    assert fired == [4, 7, 10]  # the clock starts at the first batch seen


@pytest.mark.parametrize("bad", ["0ba", "ten batches", -1])
def test_bad_intervals_are_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        Interval(bad)


def test_epoch_interval_waits_for_the_horizon():
    """Data without a length: nothing fires until the loop has learnt the epoch's size."""
    trigger = Interval("1ep")
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
