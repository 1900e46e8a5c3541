"""Scale schedule ratio: stretched schedules follow the same curve; scaled durations round up."""

import dataclasses
import doctest
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sched_helpers import close, schedule_and_reference, ts_

from functrain import schedules as S
from functrain.schedules import scaling
from functrain.units import Time, Timestamp

ratios = st.sampled_from([0.25, 0.5, 1.5, 2.0, 3.0, 10.0])


@settings(max_examples=50, deadline=None)
@given(schedule_and_reference(), ratios, ts_)
def test_scale_ratio_stretches_time(pair, ratio, t):
    schedule, _ = pair
    if hasattr(schedule, "scale_warmup"):
        schedule = dataclasses.replace(schedule, scale_warmup=True)
    scaled = S.scale_schedule_ratio(schedule, ratio)
    assert type(scaled) is type(schedule)
    assert scaled(ratio * t) == pytest.approx(schedule(t), **close)


@settings(max_examples=30, deadline=None)
@given(ratios, st.integers(1, 50), st.integers(0, 400))
def test_scale_ratio_with_epochs_and_dur_follows_the_scaled_duration(ratio, quarter, t):
    max_batches = 4 * quarter  # so that ratio * max_batches is a whole number of batches
    assume(t <= max_batches)
    new_max = S.scale_duration(Time(max_batches, "ba"), ratio)
    assert new_max == Time(ratio * max_batches, "ba")
    s = 1e-3 * S.cosine_annealing_with_warmup("1ep", t_max="0.9dur", scale_warmup=True)
    scaled = S.scale_schedule_ratio(s, ratio)
    before = Timestamp(batch=t, batches_per_epoch=3, max_batches=max_batches)
    after = Timestamp(batch=ratio * t, batches_per_epoch=3, max_batches=new_max.value)
    assert scaled(after) == pytest.approx(s(before), **close)


def test_scale_ratio_keeps_warmup_unless_asked_and_leaves_dur_alone():
    s = S.cosine_annealing_with_warmup("10ba", t_max="100ba")
    assert S.scale_schedule_ratio(s, 2) == S.cosine_annealing_with_warmup("10ba", t_max="200ba")
    s = S.multistep_with_warmup("2ep", ["3ep", "0.5dur", "100sp"], scale_warmup=True)
    assert S.scale_schedule_ratio(s, 0.5) == S.multistep_with_warmup(
        "1ep", ["1.5ep", "0.5dur", "50sp"], scale_warmup=True
    )
    assert S.scale_schedule_ratio(s, 1.0) is s
    doubled = S.scale_schedule_ratio(S.step("100sp"), 2)
    assert doubled(Timestamp(batch=1, sample=400)) == pytest.approx(0.1**2)


def test_scale_duration():
    assert S.scale_duration("90ep", 0.5) == Time(45, "ep")
    assert S.scale_duration("3ep", 0.5) == Time(1.5, "ep")
    assert S.scale_duration("1001ba", 0.5) == Time(501, "ba")
    assert S.scale_duration("100ba", 0.3) == Time(30, "ba")
    # Not 8: 100 * 0.07 is 7.000000000000001 in floats (100 * 0.3 is exactly 30.0).
    assert 100 * 0.07 > 7
    assert S.scale_duration("100ba", 0.07) == Time(7, "ba")
    # The slack is relative 1e-12, at least 1e-12: 1.5e-12 over a whole count is a real excess.
    assert S.scale_duration("1ba", 1 + 1.5e-12) == Time(2, "ba")
    assert S.scale_duration("1ba", 1 + 0.5e-12) == Time(1, "ba")
    assert S.scale_duration("1h", 0.25) == Time(900, "sec")
    with pytest.raises(ValueError, match="'dur' is a fraction"):
        S.scale_duration("1dur", 2)


def test_scale_ratio_errors():
    for bad in (0, -1, math.nan):
        with pytest.raises((ValueError, TypeError), match="ratio"):
            S.scale_schedule_ratio(S.linear(), bad)
    with pytest.raises(TypeError, match="Schedule"):
        S.scale_schedule_ratio(lambda t: 1.0, 2)
    with pytest.raises(TypeError, match="cannot scale"):
        S.scale_schedule_ratio(S.Scaled(lambda t: 1.0, 2.0), 2)


def test_docstring_examples_run():
    assert doctest.testmod(scaling).failed == 0
