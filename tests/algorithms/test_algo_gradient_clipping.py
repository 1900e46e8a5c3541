"""gradient_clipping: the transform_grads wrapper bounds what the optimizer sees."""

import pytest
import torch
from _algo_model_helpers import (
    assert_pure,
    assert_resume_exact,
    make,
    mlp,
    mse_loss,
    regression_batches,
    run,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain import optim
from functrain.algorithms import gradient_clipping
from functrain.tree import tree_allclose


def _grads_seen(clipping_type, threshold, batch):
    """The gradients the optimizer receives, captured with a recording optimizer."""
    seen = {}
    base = optim.sgd(0.0)

    def update(grads, state, params=None, **extra):
        seen.update({k: v.clone() for k, v in grads.items()})
        return base.update(grads, state, params, **extra)

    opt = optim.Transform(base.init, update)
    model = mlp()
    state = functrain.init(model, opt)
    step = functrain.compose(
        functrain.make_step(model, mse_loss, opt), gradient_clipping(clipping_type, threshold)
    )
    step(state, batch)
    return seen, state


@settings(max_examples=20, deadline=None)
@given(threshold=st.floats(1e-3, 10.0), seed=st.integers(0, 1000))
def test_norm_clipping_bounds_the_global_norm(threshold, seed):
    batch = regression_batches(1, seed=seed)[0]
    seen, _ = _grads_seen("norm", threshold, batch)
    assert float(optim.global_norm(seen)) <= threshold * (1 + 1e-5)


@settings(max_examples=20, deadline=None)
@given(threshold=st.floats(1e-3, 1.0), seed=st.integers(0, 1000))
def test_value_clipping_bounds_every_entry(threshold, seed):
    seen, _ = _grads_seen("value", threshold, regression_batches(1, seed=seed)[0])
    limit = float(torch.tensor(threshold, dtype=torch.float32))
    assert max(float(g.abs().max()) for g in seen.values()) <= limit


@settings(max_examples=20, deadline=None)
@given(threshold=st.floats(1e-3, 0.5), seed=st.integers(0, 1000))
def test_adaptive_clipping_bounds_unit_ratios(threshold, seed):
    seen, state = _grads_seen("adaptive", threshold, regression_batches(1, seed=seed)[0])
    for name, g in seen.items():
        w_norm = optim.unitwise_norm(state.params[name]).clamp(min=1e-3)
        assert bool((optim.unitwise_norm(g) <= threshold * w_norm * (1 + 1e-5) + 1e-12).all())


def test_huge_threshold_is_the_plain_step_exactly():
    model, batches = mlp(), regression_batches(3)
    state = functrain.init(model, optim.sgd(0.05, momentum=0.9))
    plain, _ = run(make(model, mse_loss, lambda: []), state, batches)
    clipped, _ = run(
        make(model, mse_loss, lambda: [gradient_clipping("norm", 1e9)]), state, batches
    )
    assert tree_allclose(plain, clipped)


def test_pure_and_resumable():
    model, batches = mlp(), regression_batches(4)
    state = functrain.init(model, optim.sgd(0.05, momentum=0.9))

    def factory():
        return [gradient_clipping("adaptive", 0.01)]

    assert_pure(make(model, mse_loss, factory), state, batches[0])
    assert_resume_exact(model, mse_loss, factory, state, batches)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="clipping_type"):
        gradient_clipping("l1", 1.0)
    with pytest.raises(ValueError, match="clipping_threshold"):
        gradient_clipping("norm", 0.0)
    with pytest.raises(ValueError, match="clipping_threshold"):
        gradient_clipping("value", -1.0)
