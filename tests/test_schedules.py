"""Schedules: Composer's formulas, bounds, monotonicity, warm-up continuity, scale ratio, config."""

import dataclasses
import json
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from functrain import schedules as S
from functrain.time import Time, Timestamp

close = dict(rel=1e-9, abs=1e-12)

# ---- reference formulas, written from Composer's scheduler docs (times in batches) -------------


def clip01(x):
    return min(1.0, max(0.0, x))


def ref_cos(tau, alpha_f):
    return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * clip01(tau)))


def ref_tau_w(t, w, t_max):
    return clip01((t - w) / (t_max - w)) if t_max > w else 0.0


def ref_restarts(t, t_0, t_mult, alpha_f, *, with_tau=False):
    start, length = 0.0, float(t_0)
    while start + length <= t:
        start, length = start + length, length * t_mult
    tau = (t - start) / length
    return (
        (ref_cos(tau, alpha_f), tau * length, (1 - tau) * length)
        if with_tau
        else ref_cos(tau, alpha_f)
    )


alphas = st.floats(0.0, 2.0)
gammas = st.floats(0.0, 1.0)
lengths = st.integers(1, 400)
ts_ = st.integers(0, 1000)


@st.composite
def schedule_and_reference(draw):
    """A schedule in batch units with its Composer formula as a plain function of t."""
    kind = draw(
        st.sampled_from(
            [
                "constant",
                "step",
                "multistep",
                "linear",
                "exponential",
                "cosine",
                "restarts",
                "polynomial",
                "constant_w",
                "linear_w",
                "cosine_w",
                "polynomial_w",
                "multistep_w",
            ]
        )
    )
    a, b, g, T, w = draw(alphas), draw(alphas), draw(gammas), draw(lengths), draw(lengths)
    power = draw(st.floats(0.0, 4.0))
    ms = sorted(draw(st.lists(lengths, max_size=4)))
    if kind == "constant":
        return S.constant(a, T), lambda t: a if t < T else 1.0
    if kind == "step":
        return S.step(T, g), lambda t: g ** (t // T)
    if kind == "multistep":
        return S.multistep(ms, g), lambda t: g ** sum(t >= m for m in ms)
    if kind == "linear":
        return S.linear(a, b, T), lambda t: a + (b - a) * min(1.0, t / T)
    if kind == "exponential":
        ge = max(g, 1e-3)
        return S.exponential(ge, T), lambda t: ge ** (t / T)
    if kind == "cosine":
        return S.cosine_annealing(T, b), lambda t: ref_cos(t / T, b)
    if kind == "restarts":
        m = draw(st.sampled_from([1.0, 1.5, 2.0, 3.0]))  # exact cycle boundaries in floats
        return S.cosine_annealing_warm_restarts(T, m, b), lambda t: ref_restarts(t, T, m, b)
    if kind == "polynomial":
        return S.polynomial(power, T, b), lambda t: b + (1 - b) * (1 - min(1.0, t / T)) ** power
    t_max = w + T
    if kind == "constant_w":
        ref = lambda t: a * t / w if t < w else (a if t < t_max else 1.0)  # noqa: E731
        return S.constant_with_warmup(w, a, t_max), ref
    if kind == "linear_w":
        ref = lambda t: a * t / w if t < w else a + (b - a) * ref_tau_w(t, w, t_max)  # noqa: E731
        return S.linear_with_warmup(w, a, b, t_max), ref
    if kind == "cosine_w":
        ref = lambda t: t / w if t < w else ref_cos(ref_tau_w(t, w, t_max), b)  # noqa: E731
        return S.cosine_annealing_with_warmup(w, t_max, b), ref
    if kind == "polynomial_w":
        ref = lambda t: t / w if t < w else b + (1 - b) * (1 - ref_tau_w(t, w, t_max)) ** power  # noqa: E731
        return S.polynomial_with_warmup(w, power, t_max, b), ref
    ref = lambda t: t / w if t < w else g ** sum(t >= m for m in ms)  # noqa: E731
    return S.multistep_with_warmup(w, ms, g), ref


# ---- values against Composer's formulas --------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(schedule_and_reference(), ts_)
def test_values_match_composer_formulas(pair, t):
    schedule, reference = pair
    assert schedule(t) == pytest.approx(reference(t), **close)
    assert schedule(Timestamp(batch=t)) == schedule(t)
    assert isinstance(schedule(t), float)


def test_key_points():
    cw = S.cosine_annealing_with_warmup("100ba", t_max="1100ba", alpha_f=0.1)
    assert [cw(0), cw(50), cw(100), cw(600), cw(1100), cw(5000)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.55, 0.1, 0.1], **close
    )
    lw = S.linear_with_warmup("10ba", alpha_i=0.8, alpha_f=0.2, t_max="40ba")
    assert [lw(5), lw(10), lw(25), lw(40)] == pytest.approx([0.4, 0.8, 0.5, 0.2], **close)
    pw = S.polynomial_with_warmup("10ba", t_max="110ba")  # power defaults to 2, as in Composer
    assert [pw(10), pw(60), pw(110)] == pytest.approx([1.0, 0.25, 0.0], **close)
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


# ---- bounds and monotonicity -------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(alphas, alphas, lengths, lengths, st.floats(0.0, 4.0), st.lists(ts_, min_size=1))
def test_values_stay_within_their_alphas(a, b, w, T, power, times):
    lo, hi = min(a, b), max(a, b)
    eps = 1e-12
    for t in times:
        assert lo - eps <= S.linear(a, b, T)(t) <= hi + eps
        assert min(b, 1) - eps <= S.cosine_annealing(T, b)(t) <= max(b, 1) + eps
        assert min(b, 1) - eps <= S.polynomial(power, T, b)(t) <= max(b, 1) + eps
        assert min(b, 1) - eps <= S.cosine_annealing_warm_restarts(T, 1.5, b)(t) <= max(b, 1) + eps
        # With warm-up the range also includes 0, where the warm-up starts.
        assert min(0, lo) - eps <= S.linear_with_warmup(w, a, b, w + T)(t) <= hi + eps
        assert min(0, b) - eps <= S.cosine_annealing_with_warmup(w, w + T, b)(t) <= max(b, 1) + eps
        assert min(0, a) - eps <= S.constant_with_warmup(w, a, w + T)(t) <= max(a, 1) + eps


@settings(max_examples=40, deadline=None)
@given(gammas, lengths, st.lists(lengths, max_size=4), st.lists(ts_, min_size=1))
def test_decays_stay_in_unit_interval(g, T, ms, times):
    for t in times:
        for s in (S.step(T, g), S.multistep(ms, g), S.multistep_with_warmup(T, ms, g)):
            assert 0.0 <= s(t) <= 1.0
        assert 0.0 <= S.exponential(max(g, 1e-6), T)(t) <= 1.0


def nonincreasing(values):
    return all(y <= x + 1e-12 for x, y in zip(values, values[1:]))


def nondecreasing(values):
    return all(y >= x - 1e-12 for x, y in zip(values, values[1:]))


short = st.integers(1, 120)  # every batch of the run is checked, so keep runs short


@settings(max_examples=30, deadline=None)
@given(alphas, st.floats(0.0, 1.0), gammas, short, short, st.floats(0.0, 4.0))
def test_monotone_where_defined(a, b, g, w, T, power):
    grid = range(0, 2 * (w + T) + 2)
    after = range(w, 2 * (w + T) + 2)
    values = lambda s, ts: [s(t) for t in ts]  # noqa: E731
    # Cosine, polynomial and linear decays (alpha_f <= 1) never rise after the warm-up...
    assert nonincreasing(values(S.cosine_annealing_with_warmup(w, w + T, b), after))
    assert nonincreasing(values(S.polynomial_with_warmup(w, power, w + T, b), after))
    assert nonincreasing(values(S.cosine_annealing(T, b), grid))
    # ...linear moves one way, toward alpha_f...
    lin = values(S.linear(a, b, T), grid)
    assert nonincreasing(lin) if b <= a else nondecreasing(lin)
    # ...decays with gamma <= 1 never rise...
    assert nonincreasing(values(S.step(T, g), grid))
    assert nonincreasing(values(S.exponential(max(g, 1e-6), T), grid))
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


# ---- units and horizons ------------------------------------------------------------------------


def test_epochs_and_dur_resolve_through_the_horizon():
    ts = Timestamp(batch=25, batches_per_epoch=10, max_batches=100)
    assert S.step("1ep", gamma=0.5)(ts) == 0.25
    assert S.linear(t_max="1dur")(ts) == 0.75
    assert S.cosine_annealing_with_warmup("1ep", t_max="0.5dur")(ts) == pytest.approx(
        ref_cos((25 - 10) / (50 - 10), 0.0)
    )
    # "0.3dur" of 100 batches is 30.000000000000004 in floats; batch 30 still reaches it.
    assert S.multistep(["0.3dur"], gamma=0.5)(ts.replace(batch=30)) == 0.5
    assert S.constant(0.5, "0.3dur")(ts.replace(batch=30)) == 1.0


def test_unknown_horizon_is_a_clear_error():
    with pytest.raises(ValueError, match="max_batches is unknown.*duration="):
        S.cosine_annealing()(10)
    with pytest.raises(ValueError, match="batches_per_epoch is unknown"):
        S.step("1ep")(Timestamp(batch=3))
    with pytest.raises(ValueError, match=r"CosineAnnealingSchedule\(.*\) at batch 10"):
        S.cosine_annealing()(10)


def test_samples_and_tokens_use_their_own_counters():
    ts = Timestamp(batch=4, sample=96, token=0)
    assert S.linear(t_max="192sp")(ts) == 0.5
    with pytest.raises(ValueError, match="none were counted in 4 batches.*count_tokens"):
        S.linear_with_warmup("1000tok", t_max="2000tok")(ts)
    # Mixed units meet in batches: a 64-sample warm-up is 2 batches at 32 samples a batch.
    s = S.linear_with_warmup("64sp", t_max="1dur")
    assert s(Timestamp(batch=0, max_batches=10)) == 0.0
    assert s(Timestamp(batch=6, sample=192, max_batches=10)) == pytest.approx(
        1 - (6 - 2) / (10 - 2)
    )


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


# ---- multiplying into absolute values ----------------------------------------------------------


def test_number_times_schedule_is_an_absolute_schedule():
    s = S.cosine_annealing_with_warmup("10ba", t_max="110ba")
    for lr in (1e-3 * s, s * 1e-3):
        assert isinstance(lr, S.Scaled) and lr == S.Scaled(s, 1e-3)
        assert [lr(t) for t in (0, 5, 60, 110)] == pytest.approx(
            [1e-3 * s(t) for t in (0, 5, 60, 110)]
        )
    assert 2 * (3 * s) == S.Scaled(s, 6.0)
    with pytest.raises(TypeError):
        s * s
    with pytest.raises(TypeError):
        "3" * s
    plain = S.Scaled(lambda ts: ts.batch / 10, 0.5)  # any callable of a timestamp
    assert plain(4) == 0.2


# ---- scale schedule ratio ----------------------------------------------------------------------

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
    assert S.scale_duration("100ba", 0.3) == Time(
        30, "ba"
    )  # not 31: 100 * 0.3 = 30.000000000000004
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


# ---- plain data --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(schedule_and_reference(), st.floats(1e-6, 1.0))
def test_config_round_trips_through_json(pair, factor):
    schedule, _ = pair
    for s in (schedule, factor * schedule):
        config = json.loads(json.dumps(s.to_config()))
        rebuilt = S.from_config(config)
        assert rebuilt == s and hash(rebuilt) == hash(s)
        assert rebuilt(37) == s(37)


def test_schedules_are_frozen_data():
    s = S.multistep(["1ep", "2ep"])
    assert s.milestones == (Time(1, "ep"), Time(2, "ep"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.gamma = 0.5
    assert {s: 1}[S.multistep(("1ep", "2ep"))] == 1


def test_config_errors():
    with pytest.raises(ValueError, match="unknown schedule 'cosine'.*cosine_annealing"):
        S.from_config({"name": "cosine"})
    with pytest.raises(TypeError, match="bad config for schedule 'linear'"):
        S.from_config({"name": "linear", "t_maximum": "1dur"})
    with pytest.raises(TypeError, match="a dict with a 'name'"):
        S.from_config(["linear"])
    with pytest.raises(TypeError, match="Schedule subclass"):
        S.Scaled(lambda t: 1.0, 2.0).to_config()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: S.step("0ba"), "positive length"),
        (lambda: S.cosine_annealing(t_max="30sec"), "wall-clock"),
        (lambda: S.linear_with_warmup("1h"), "wall-clock"),
        (lambda: S.multistep("10ba"), "list of times"),
        (lambda: S.exponential(0.0), "gamma must be >"),
        (lambda: S.step("10ba", gamma=-0.1), "gamma must be >="),
        (lambda: S.polynomial(-1.0), "power must be >="),
        (lambda: S.cosine_annealing_warm_restarts("10ba", t_mult=0), "t_mult must be >"),
        (lambda: S.cosine_annealing_with_warmup("1ba", scale_warmup=1), "scale_warmup"),
        (lambda: S.linear(alpha_i=math.inf), "alpha_i must be a finite"),
        (lambda: S.linear(t_max="ten batches"), "accepted forms"),
    ],
)
def test_bad_arguments_name_the_problem(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize("bad", [-1, math.nan, "10ba", None, True])
def test_bad_times_are_refused(bad):
    with pytest.raises((ValueError, TypeError), match="schedule"):
        S.linear(t_max="10ba")(bad)


def test_docstring_examples_run():
    import doctest

    assert doctest.testmod(S).failed == 0


def test_counts_may_be_numpy_or_0d_tensors():
    import numpy as np
    import torch

    s = S.linear_with_warmup("2ba", t_max="10ba")
    assert s(torch.tensor(5)) == s(np.int64(5)) == s(5.0) == s(5)
