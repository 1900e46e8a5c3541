"""Warm-up schedules: Composer's formulas, defaults, the ramp, continuity, monotonicity, units."""

import dataclasses
import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import (
    WARMUP_KINDS,
    alphas,
    check_against_reference,
    close,
    gammas,
    lengths,
    nondecreasing,
    nonincreasing,
    schedule_and_reference,
    short,
    ts_,
)

from functrain import schedules as S
from functrain.schedules import warmup
from functrain.units import Time, Timestamp

# ---- values against Composer's formulas --------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(schedule_and_reference(WARMUP_KINDS), ts_)
def test_values_match_composer_formulas(pair, t):
    check_against_reference(pair, t)


def test_key_points():
    cw = S.cosine_annealing_with_warmup("100ba", t_max="1100ba", alpha_f=0.1)
    assert [cw(0), cw(50), cw(100), cw(600), cw(1100), cw(5000)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.55, 0.1, 0.1], **close
    )
    lw = S.linear_with_warmup("10ba", alpha_i=0.8, alpha_f=0.2, t_max="40ba")
    assert [lw(5), lw(10), lw(25), lw(40)] == pytest.approx([0.4, 0.8, 0.5, 0.2], **close)
    pw = S.polynomial_with_warmup("10ba", t_max="110ba")  # power defaults to 2, as in Composer
    assert [pw(10), pw(60), pw(110)] == pytest.approx([1.0, 0.25, 0.0], **close)


def test_defaults_follow_composer():
    cw = S.cosine_annealing_with_warmup(t_warmup="100ba")
    assert (cw.t_max, cw.alpha_f, cw.scale_warmup) == (Time(1, "dur"), 0.0, False)
    assert S.polynomial_with_warmup("1ba").power == 2.0


def test_constant_with_warmup_ramps_to_alpha_then_returns_one_after_t_max():
    s = S.constant_with_warmup("10ba", alpha=0.5, t_max="30ba")
    assert [s(0), s(5), s(10), s(29), s(30)] == pytest.approx([0.0, 0.25, 0.5, 0.5, 1.0])


def test_zero_warmup_starts_at_the_schedule():
    assert S.cosine_annealing_with_warmup("0ba", t_max="10ba")(0) == 1.0
    assert S.linear_with_warmup(0, alpha_i=0.7, t_max="10ba")(0) == 0.7


def test_t_max_not_after_warmup_holds_the_start_value():
    # Composer: tau_w = 0 when t_max <= t_warmup.
    assert S.linear_with_warmup("10ba", alpha_i=0.9, t_max="5ba")(50) == 0.9


def test_mixed_units_meet_in_batches():
    # A 64-sample warm-up is 2 batches at 32 samples a batch.
    s = S.linear_with_warmup("64sp", t_max="1dur")
    assert s(Timestamp(batch=0, max_batches=10)) == 0.0
    assert s(Timestamp(batch=6, sample=192, max_batches=10)) == pytest.approx(
        1 - (6 - 2) / (10 - 2)
    )


# ---- bounds, monotonicity and continuity -------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(alphas, alphas, lengths, lengths, st.lists(ts_, min_size=1))
def test_values_stay_within_their_alphas(a, b, w, T, times):
    lo, hi = min(a, b), max(a, b)
    eps = 1e-12
    for t in times:
        # With warm-up the range also includes 0, where the warm-up starts.
        assert min(0, lo) - eps <= S.linear_with_warmup(w, a, b, w + T)(t) <= hi + eps
        assert min(0, b) - eps <= S.cosine_annealing_with_warmup(w, w + T, b)(t) <= max(b, 1) + eps
        assert min(0, a) - eps <= S.constant_with_warmup(w, a, w + T)(t) <= max(a, 1) + eps


@settings(max_examples=40, deadline=None)
@given(gammas, lengths, st.lists(lengths, max_size=4), st.lists(ts_, min_size=1))
def test_multistep_with_warmup_stays_in_unit_interval(g, T, ms, times):
    for t in times:
        assert 0.0 <= S.multistep_with_warmup(T, ms, g)(t) <= 1.0


@settings(max_examples=30, deadline=None)
@given(alphas, st.floats(0.0, 1.0), gammas, short, short, st.floats(0.0, 4.0))
def test_monotone_where_defined(a, b, g, w, T, power):
    after = range(w, 2 * (w + T) + 2)
    values = lambda s, ts: [s(t) for t in ts]  # noqa: E731
    # Cosine and polynomial decays (alpha_f <= 1) never rise after the warm-up...
    assert nonincreasing(values(S.cosine_annealing_with_warmup(w, w + T, b), after))
    assert nonincreasing(values(S.polynomial_with_warmup(w, power, w + T, b), after))
    # ...and every warm-up rises to where the schedule starts.
    warm = range(0, w + 1)
    for s in (
        S.cosine_annealing_with_warmup(w, w + T, b),
        S.linear_with_warmup(w, a, b, w + T),
        S.constant_with_warmup(w, a, w + T),
        S.polynomial_with_warmup(w, power, w + T, b),
        S.multistep_with_warmup(w, [w + T], g),
    ):
        assert nondecreasing(values(s, warm))


@settings(max_examples=40, deadline=None)
@given(alphas, alphas, gammas, lengths, lengths, st.floats(0.0, 4.0))
def test_continuous_at_the_end_of_warmup(a, b, g, w, T, power):
    for s in (
        S.cosine_annealing_with_warmup(w, w + T, b),
        S.linear_with_warmup(w, a, b, w + T),
        S.constant_with_warmup(w, a, w + T),
        S.polynomial_with_warmup(w, max(power, 1e-3), w + T, b),
        S.multistep_with_warmup(w, [w + T], g),
    ):
        # A fractional batch count approaches the end of the warm-up from below.
        assert s(w - 1e-7) == pytest.approx(s(w), abs=1e-6)


def test_docstring_examples_run():
    assert doctest.testmod(warmup).failed == 0


WARMUP_SCHEDULES = [
    S.constant_with_warmup("10ba"),
    S.linear_with_warmup("10ba"),
    S.cosine_annealing_with_warmup("10ba"),
    S.polynomial_with_warmup("10ba"),
    S.multistep_with_warmup("10ba", ["20ba"]),
]


@pytest.mark.parametrize("schedule", WARMUP_SCHEDULES, ids=lambda s: type(s).__name__)
def test_every_warmup_schedule_is_a_frozen_hashable_value(schedule):
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.t_warmup = schedule.t_warmup
    assert {schedule: 1}[dataclasses.replace(schedule)] == 1


@pytest.mark.parametrize("schedule", WARMUP_SCHEDULES, ids=lambda s: type(s).__name__)
def test_scaling_keeps_the_warmup_length_by_default(schedule):
    # Composer's default (scale_warmup=False): a 2x longer run warms up over the same 10 batches.
    assert S.scale_schedule_ratio(schedule, 2.0).t_warmup == Time(10, "ba")
    assert S.scale_schedule_ratio(schedule, 2.0)(5) == 0.5


@pytest.mark.parametrize(
    "make", [S.linear_with_warmup, S.cosine_annealing_with_warmup, S.polynomial_with_warmup]
)
def test_a_warmup_in_samples_at_the_first_batch_is_the_start_of_the_decay(make):
    # An empty warm-up in samples beside a horizon in batches: at batch 0 nothing can be converted
    # (no samples per batch known yet) and the decay has not begun: the multiplier is 1.
    assert make(t_warmup="0sp", t_max="10ba")(Timestamp()) == 1.0
