"""Clipping laws: bounds hold, identity below the threshold, AGC per output unit."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import (
    EmptyState,
    adaptive_grad_clip,
    clip_by_global_norm,
    clip_by_value,
    global_norm,
    unitwise_norm,
)

seeds = st.integers(0, 2**31 - 1)
scales = st.floats(1e-3, 1e3)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, scale=scales, max_norm=st.floats(0.01, 100.0), donate=st.booleans())
def test_clip_by_global_norm_bounds_the_norm(random_tree, seed, scale, max_norm, donate):
    grads = random_tree(seed, scale)
    before = global_norm(grads)
    t = clip_by_global_norm(max_norm)
    originals = {k: v.clone() for k, v in grads.items()}
    updates, state = t.update(grads, t.init(grads), donate=donate)
    assert state == EmptyState()
    after = global_norm(updates)
    assert after <= max_norm * (1 + 1e-5)
    if before <= max_norm:  # identity below the threshold, bit for bit
        assert all(torch.equal(updates[k], originals[k]) for k in grads)
    else:  # same direction, norm exactly max_norm
        assert after == pytest.approx(max_norm, rel=1e-5)
        ratio = updates["fc.weight"] / originals["fc.weight"]
        assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, scale=scales, limit=st.floats(1e-3, 10.0), donate=st.booleans())
def test_clip_by_value_bounds_every_element(random_tree, seed, scale, limit, donate):
    grads = random_tree(seed, scale)
    originals = {k: v.clone() for k, v in grads.items()}
    t = clip_by_value(limit)
    updates, _ = t.update(grads, t.init(grads), donate=donate)
    for k, u in updates.items():
        assert u.abs().max() <= limit
        inside = originals[k].abs() <= limit
        assert torch.equal(u[inside], originals[k][inside])


def test_clip_by_value_min_max():
    g = {"w": torch.tensor([-3.0, -0.5, 0.2, 4.0])}
    t = clip_by_value(min=-1.0, max=0.1)
    updates, _ = t.update(g, t.init(g))
    assert torch.equal(updates["w"], torch.tensor([-1.0, -0.5, 0.1, 0.1]))
    only_min = clip_by_value(min=-1.0)
    updates, _ = only_min.update(g, only_min.init(g))
    assert torch.equal(updates["w"], torch.tensor([-1.0, -0.5, 0.2, 4.0]))
    only_max = clip_by_value(max=0.0)
    updates, _ = only_max.update(g, only_max.init(g))
    assert torch.equal(updates["w"], torch.tensor([-3.0, -0.5, 0.0, 0.0]))
    assert torch.equal(g["w"], torch.tensor([-3.0, -0.5, 0.2, 4.0]))  # pure


def test_clip_bad_arguments():
    with pytest.raises(ValueError, match="max_norm"):
        clip_by_global_norm(0.0)
    with pytest.raises(ValueError, match="not both"):
        clip_by_value(1.0, min=0.0)
    with pytest.raises(ValueError, match="needs limit="):
        clip_by_value()
    with pytest.raises(ValueError, match="larger than max"):
        clip_by_value(min=1.0, max=0.0)
    with pytest.raises(ValueError, match="needs the current parameters"):
        agc = adaptive_grad_clip()
        agc.update({"w": torch.ones(2)}, agc.init({"w": torch.ones(2)}))


def _composer_agc(grads, params, clipping):
    """Composer's adaptive clipping, written out (eps = 0)."""
    out = {}
    for k, g in grads.items():
        coeff = (unitwise_norm(params[k]) * clipping / unitwise_norm(g)).nan_to_num(nan=1.0)
        out[k] = g * coeff.clamp(max=1.0)
    return out


@settings(max_examples=30, deadline=None)
@given(
    seed=seeds,
    scale=scales,
    clipping=st.floats(1e-3, 1.0),
    eps=st.sampled_from([0.0, 1e-3]),
    donate=st.booleans(),
)
def test_adaptive_grad_clip_per_unit(random_tree, seed, scale, clipping, eps, donate):
    params, grads = random_tree(seed), random_tree(seed + 1, scale)
    originals = {k: v.clone() for k, v in grads.items()}
    t = adaptive_grad_clip(clipping, eps)
    updates, _ = t.update(grads, t.init(params), params, donate=donate)
    for k, u in updates.items():
        limit = unitwise_norm(params[k]).clamp(min=eps) * clipping
        g_norm, u_norm = unitwise_norm(originals[k]), unitwise_norm(u)
        assert torch.all(u_norm <= limit * (1 + 1e-5))
        below = (g_norm <= limit).expand_as(u)
        assert torch.allclose(u[below], originals[k][below])
    if eps == 0.0:
        ref = _composer_agc(originals, params, clipping)
        assert all(torch.allclose(updates[k], ref[k], rtol=1e-6, atol=0) for k in ref)


def test_adaptive_grad_clip_units_are_rows():
    params = {"w": torch.tensor([[1.0, 0.0], [0.0, 100.0]])}
    grads = {"w": torch.tensor([[3.0, 4.0], [3.0, 4.0]])}  # each row has norm 5
    t = adaptive_grad_clip(clipping=0.1, eps=0.0)
    updates, _ = t.update(grads, t.init(params), params)
    # Row 0: limit 0.1 -> scaled to norm 0.1. Row 1: limit 10 -> untouched.
    assert torch.allclose(updates["w"][0], torch.tensor([0.06, 0.08]))
    assert torch.equal(updates["w"][1], grads["w"][1])


def test_adaptive_grad_clip_eps_lets_zero_weights_move():
    params, grads = {"b": torch.zeros(3)}, {"b": torch.ones(3)}
    with_eps, composer = adaptive_grad_clip(0.5, eps=1e-3), adaptive_grad_clip(0.5, eps=0.0)
    moved, _ = with_eps.update(grads, with_eps.init(params), params)
    frozen, _ = composer.update(grads, composer.init(params), params)
    assert torch.linalg.vector_norm(moved["b"]) == pytest.approx(0.5e-3, rel=1e-5)
    assert torch.equal(frozen["b"], torch.zeros(3))


def test_adaptive_grad_clip_default_eps_is_one_thousandth():
    # A zero weight row with the defaults (clipping 0.01, eps 1e-3): its gradient may have norm
    # 0.01 * 1e-3 = 1e-5, so a unit gradient row is scaled to exactly that norm.
    params, grads = {"w": torch.zeros(2, 4)}, {"w": torch.full((2, 4), 0.5)}  # rows of norm 1
    agc = adaptive_grad_clip()
    updates, _ = agc.update(grads, agc.init(params), params)
    assert torch.allclose(updates["w"], torch.full((2, 4), 0.5e-5))
