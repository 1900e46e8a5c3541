"""Composer's schedule formulas as plain functions of t (in batches), and hypothesis strategies."""

import math

import pytest
from hypothesis import strategies as st

from functrain import schedules as S
from functrain.units import Timestamp

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


def nonincreasing(values):
    return all(y <= x + 1e-12 for x, y in zip(values, values[1:]))


def nondecreasing(values):
    return all(y >= x - 1e-12 for x, y in zip(values, values[1:]))


alphas = st.floats(0.0, 2.0)
gammas = st.floats(0.0, 1.0)
lengths = st.integers(1, 400)
ts_ = st.integers(0, 1000)
short = st.integers(1, 120)  # every batch of the run is checked, so keep runs short

DECAY_KINDS = (
    "constant",
    "step",
    "multistep",
    "linear",
    "exponential",
    "cosine",
    "restarts",
    "polynomial",
)
WARMUP_KINDS = ("constant_w", "linear_w", "cosine_w", "polynomial_w", "multistep_w")


@st.composite
def schedule_and_reference(draw, kinds=DECAY_KINDS + WARMUP_KINDS):
    """A schedule in batch units with its Composer formula as a plain function of t."""
    kind = draw(st.sampled_from(kinds))
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


def check_against_reference(pair, t):
    """The schedule equals its Composer formula at `t`, as a float, for a count or a Timestamp."""
    schedule, reference = pair
    assert schedule(t) == pytest.approx(reference(t), **close)
    assert schedule(Timestamp(batch=t)) == schedule(t)
    assert isinstance(schedule(t), float)
