"""Gradient clipping cores: bounds hold, small gradients pass unchanged, inputs untouched."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.gradient_clipping import (
    adaptive_clip_grad,
    clip_grad_norm,
    clip_grad_value,
    global_grad_norm,
    unitwise_norm,
)

tensors = st.integers(0, 10_000).map(
    lambda s: {
        "w": torch.randn(3, 4, generator=torch.Generator().manual_seed(s)) * (s % 7 + 0.1),
        "b": torch.randn(3, generator=torch.Generator().manual_seed(s + 1)),
    }
)


@settings(max_examples=40, deadline=None)
@given(grads=tensors, max_norm=st.floats(1e-3, 20.0))
def test_norm_clipping_bounds_and_preserves_direction(grads, max_norm):
    before = {k: v.clone() for k, v in grads.items()}
    out = clip_grad_norm(grads, max_norm)
    norm = float(global_grad_norm(grads))
    assert float(global_grad_norm(out)) <= max_norm * (1 + 1e-5)
    if norm <= max_norm:
        assert all(torch.equal(out[k], grads[k]) for k in grads)
    ratio = out["w"] / grads["w"]
    torch.testing.assert_close(ratio, torch.full_like(ratio, float(ratio.flatten()[0])))
    assert all(torch.equal(before[k], grads[k]) for k in grads)


@settings(max_examples=40, deadline=None)
@given(grads=tensors, limit=st.floats(0.0, 3.0))
def test_value_clipping_bounds_entries(grads, limit):
    out = clip_grad_value(grads, limit)
    bound = float(torch.tensor(limit, dtype=torch.float32))
    assert all(float(v.abs().max()) <= bound for v in out.values())


@settings(max_examples=40, deadline=None)
@given(grads=tensors, params=tensors, threshold=st.floats(1e-3, 1.0))
def test_adaptive_clipping_bounds_unit_ratios(grads, params, threshold):
    out = adaptive_clip_grad(grads, params, threshold)
    for k in grads:
        limit = threshold * unitwise_norm(params[k]).clamp(min=1e-3)
        assert bool((unitwise_norm(out[k]) <= limit * (1 + 1e-5)).all())


def test_errors():
    with pytest.raises(ValueError):
        clip_grad_norm({"w": torch.ones(2)}, 0.0)
    with pytest.raises(ValueError, match="clip_value"):
        clip_grad_value({"w": torch.ones(2)}, -1.0)
    with pytest.raises(KeyError, match="missing"):
        adaptive_clip_grad({"w": torch.ones(2)}, {}, 0.1)


def test_apply_gradient_clipping_under_composers_signature_is_pure():
    from functrain.functional import apply_gradient_clipping

    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
    model.weight.grad = torch.tensor([[3.0, -4.0]])  # norm 5
    by_norm = apply_gradient_clipping(model, "norm", 1.0)
    torch.testing.assert_close(by_norm["weight"], torch.tensor([[0.6, -0.8]]))
    by_value = apply_gradient_clipping(model, "value", 2.0)
    torch.testing.assert_close(by_value["weight"], torch.tensor([[2.0, -2.0]]))
    # AGC on the single unit (one output row): |g| = 5 > 0.5 * |w| = 0.5 * sqrt(5)
    adaptive = apply_gradient_clipping(model, "adaptive", 0.5)
    expected = torch.tensor([[3.0, -4.0]]) * (0.5 * 5**0.5 / 5.0)
    torch.testing.assert_close(adaptive["weight"], expected)
    assert torch.equal(model.weight.grad, torch.tensor([[3.0, -4.0]]))  # untouched
    with pytest.raises(ValueError, match="clipping_type"):
        apply_gradient_clipping(model, "global", 1.0)


def test_apply_gradient_clipping_adaptive_zeroes_units_whose_weights_are_zero():
    from functrain.functional import apply_gradient_clipping

    # Composer 0.32.1: limit = threshold * |w_unit| with no floor, so a zero unit gets nothing
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.0, 0.0], [3.0, 4.0]]))
        model.bias.zero_()
    model.weight.grad = torch.tensor([[1e-6, -2e-6], [0.3, 0.4]])
    model.bias.grad = torch.tensor([1.0, -1.0])
    out = apply_gradient_clipping(model, "adaptive", 0.1)
    assert torch.equal(out["weight"][0], torch.zeros(2))  # the all-zero row: zeroed
    torch.testing.assert_close(out["weight"][1], torch.tensor([0.3, 0.4]))  # 0.5 <= 0.1 * 5
    assert torch.equal(out["bias"], torch.zeros(2))  # a zero bias is one all-zero unit
    # zero weight and zero gradient: 0/0 is kept at coefficient 1 (still zero), no nan
    model.weight.grad = torch.zeros(2, 2)
    assert torch.equal(apply_gradient_clipping(model, "adaptive", 0.1)["weight"], torch.zeros(2, 2))
    # the functrain-level function keeps the paper's floor unless told otherwise
    floored = adaptive_clip_grad({"b": torch.tensor([1.0, -1.0])}, {"b": torch.zeros(2)}, 0.1)
    assert floored["b"].abs().max() > 0


def test_adaptive_threshold_zero_stops_every_unit_and_negative_is_rejected():
    # A threshold of 0 allows no gradient at all: every unit's limit is 0 * max(|w|, eps) = 0.
    grads = {"w": torch.tensor([[3.0, 4.0], [0.0, -1.0]]), "b": torch.tensor([2.0, 0.0])}
    params = {"w": torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "b": torch.tensor([1.0, 1.0])}
    out = adaptive_clip_grad(grads, params, 0.0)
    assert all(torch.equal(out[k], torch.zeros_like(grads[k])) for k in grads)
    for bad in (-1e-6, -0.5, -2.0):
        with pytest.raises(ValueError, match="clipping_threshold must be >= 0"):
            adaptive_clip_grad(grads, params, bad)


def test_adaptive_missing_parameters_error_names_the_first_three():
    grads = {k: torch.ones(1) for k in "abcde"}
    with pytest.raises(KeyError, match=r"missing \['a', 'b', 'c'\]"):
        adaptive_clip_grad(grads, {}, 0.1)
