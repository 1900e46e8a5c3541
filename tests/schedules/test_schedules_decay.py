"""Schedules without warm-up: Composer's formulas, defaults, bounds, monotonicity, warm restarts."""

import dataclasses
import doctest

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sched_helpers import (
    DECAY_KINDS,
    alphas,
    check_against_reference,
    close,
    gammas,
    lengths,
    nondecreasing,
    nonincreasing,
    ref_restarts,
    schedule_and_reference,
    short,
    ts_,
)

from functrain import schedules as S
from functrain.schedules import decay
from functrain.units import Time, Timestamp

# ---- values against Composer's formulas --------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(schedule_and_reference(DECAY_KINDS), ts_)
def test_values_match_composer_formulas(pair, t):
    check_against_reference(pair, t)


def test_key_points():
    assert S.step("30ba")(90) == pytest.approx(1e-3)  # gamma defaults to 0.1
    assert S.multistep(["30ba", "60ba"])(75) == pytest.approx(0.01)
    assert S.exponential(0.5)(Timestamp(batch=20, batches_per_epoch=10)) == 0.25  # "1ep" period
    r = S.cosine_annealing_warm_restarts("10ba", t_mult=2.0, alpha_f=0.2)
    assert [r(0), r(5), r(10), r(20), r(30), r(50)] == pytest.approx(
        [1.0, 0.6, 1.0, 0.6, 1.0, 0.6], **close
    )


def test_defaults_follow_composer():
    assert S.cosine_annealing() == S.cosine_annealing(t_max="1dur", alpha_f=0.0)
    assert S.linear() == S.linear(alpha_i=1.0, alpha_f=0.0, t_max="1dur")
    assert S.constant() == S.constant(alpha=1.0, t_max="1dur")
    assert S.exponential(0.9).decay_period == Time(1, "ep")


# ---- bounds and monotonicity -------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(alphas, alphas, lengths, st.floats(0.0, 4.0), st.lists(ts_, min_size=1))
def test_values_stay_within_their_alphas(a, b, T, power, times):
    lo, hi = min(a, b), max(a, b)
    eps = 1e-12
    for t in times:
        assert lo - eps <= S.linear(a, b, T)(t) <= hi + eps
        assert min(b, 1) - eps <= S.cosine_annealing(T, b)(t) <= max(b, 1) + eps
        assert min(b, 1) - eps <= S.polynomial(power, T, b)(t) <= max(b, 1) + eps
        assert min(b, 1) - eps <= S.cosine_annealing_warm_restarts(T, 1.5, b)(t) <= max(b, 1) + eps


@settings(max_examples=40, deadline=None)
@given(gammas, lengths, st.lists(lengths, max_size=4), st.lists(ts_, min_size=1))
def test_decays_stay_in_unit_interval(g, T, ms, times):
    for t in times:
        for s in (S.step(T, g), S.multistep(ms, g)):
            assert 0.0 <= s(t) <= 1.0
        assert 0.0 <= S.exponential(max(g, 1e-6), T)(t) <= 1.0


@settings(max_examples=30, deadline=None)
@given(alphas, st.floats(0.0, 1.0), gammas, short, short)
def test_monotone_where_defined(a, b, g, w, T):
    grid = range(0, 2 * (w + T) + 2)  # runs on well past t_max, where step and exponential fall
    values = lambda s, ts: [s(t) for t in ts]  # noqa: E731
    # Cosine decays (alpha_f <= 1) never rise...
    assert nonincreasing(values(S.cosine_annealing(T, b), grid))
    # ...linear moves one way, toward alpha_f...
    lin = values(S.linear(a, b, T), grid)
    assert nonincreasing(lin) if b <= a else nondecreasing(lin)
    # ...and decays with gamma <= 1 never rise.
    assert nonincreasing(values(S.step(T, g), grid))
    assert nonincreasing(values(S.exponential(max(g, 1e-6), T), grid))


# ---- warm restarts -----------------------------------------------------------------------------


def test_warm_restarts_with_shrinking_cycles():
    s = S.cosine_annealing_warm_restarts("10ba", t_mult=0.5)
    for t in (0, 5, 10, 12, 15, 17, 19):
        assert s(t) == pytest.approx(ref_restarts(t, 10, 0.5, 0.0), **close)
    assert 0.0 <= s(19.999) <= 1.0  # many tiny cycles, still found quickly
    with pytest.raises(ValueError, match="add up to only 20 batches.*t_mult >= 1"):
        s(20)


def test_warm_restarts_with_t_mult_a_hair_above_one_match_t_mult_one():
    # (m**i - 1) / (m - 1) cancels badly near m = 1; the schedule must not drift.
    near, one = S.cosine_annealing_warm_restarts(7, 1 + 1e-12), S.cosine_annealing_warm_restarts(7)
    for t in (3, 10, 100, 1000):
        assert near(t) == pytest.approx(one(t), abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(lengths, st.floats(1.0, 3.0), st.integers(0, 100_000))
def test_warm_restarts_closed_form_matches_the_cycle_loop(t_0, t_mult, t):
    value, since_start, to_end = ref_restarts(t, t_0, t_mult, 0.0, with_tau=True)
    # At a restart the value jumps from 0 to 1; where float rounding leaves a cycle boundary
    # within a hair of t, the loop above and the closed form may land on either side of it.
    assume(t_mult.is_integer() or min(since_start, to_end) > 1e-9 * max(1.0, t))
    s = S.cosine_annealing_warm_restarts(t_0, t_mult)
    assert s(t) == pytest.approx(value, rel=1e-6, abs=1e-6)


def test_docstring_examples_run():
    assert doctest.testmod(decay).failed == 0


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: decay.MultiStepSchedule(["10ba"], gamma=-0.5), "gamma"),
        (lambda: decay.LinearSchedule(t_max="0ba"), "t_max"),
        (lambda: decay.ExponentialSchedule(0.5, decay_period="0ba"), "decay_period"),
    ],
)
def test_out_of_range_arguments_are_refused(make, message):
    """A negative decay factor or a zero length makes no schedule (survivors of `python -m
    bench mutants`: these checks were untested)."""
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: decay.StepSchedule("0ba"), "step_size"),
        (lambda: decay.ExponentialSchedule(0.0, decay_period="10ba"), "gamma"),
        (lambda: decay.CosineAnnealingSchedule(t_max="0ba"), "t_max"),
        (lambda: decay.CosineAnnealingWarmRestartsSchedule("10ba", t_mult=0.0), "t_mult"),
    ],
)
def test_zero_lengths_and_factors_are_refused(make, message):
    """A zero step or period has no decay count, and exponential decay by 0 (or cycles that do
    not grow at all) have no meaning: each is refused, naming the argument."""
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "schedule",
    [
        decay.ConstantSchedule(),
        decay.StepSchedule("10ba"),
        decay.MultiStepSchedule(["10ba"]),
        decay.LinearSchedule(),
        decay.ExponentialSchedule(0.5),
        decay.CosineAnnealingSchedule(),
        decay.CosineAnnealingWarmRestartsSchedule("10ba"),
        decay.PolynomialSchedule(2.0),
    ],
    ids=lambda s: type(s).__name__,
)
def test_every_decay_schedule_is_a_frozen_hashable_value(schedule):
    field = dataclasses.fields(schedule)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(schedule, field, getattr(schedule, field))
    assert {schedule: 1}[dataclasses.replace(schedule)] == 1
