"""sam: the optimizer gets the gradient at the ascended weights, every `interval` steps."""

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
from functrain.algorithms import sam
from functrain.tree import tree_allclose


def _grads_at(model, params, batch):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    loss = mse_loss(lambda x: torch.func.functional_call(model, leaves, (x,)), batch)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def test_zero_rho_is_the_plain_step_exactly():
    model, batches = mlp(), regression_batches(3)
    state = functrain.init(model, optim.sgd(0.05, momentum=0.9))
    plain, _ = run(make(model, mse_loss, lambda: []), state, batches)
    with_sam, _ = run(make(model, mse_loss, lambda: [sam(rho=0.0)]), state, batches)
    assert tree_allclose(plain, with_sam)


@settings(max_examples=15, deadline=None)
@given(rho=st.floats(0.01, 1.0), seed=st.integers(0, 1000))
def test_update_uses_the_gradient_at_the_ascended_point(rho, seed):
    model, batch = mlp(), regression_batches(1, seed=seed)[0]
    opt = optim.sgd(1.0)  # params_new = params - grads
    state = functrain.init(model, opt)
    new, _ = make(model, mse_loss, lambda: [sam(rho=rho)], opt)(state, batch)
    g = _grads_at(model, state.params, batch)
    norm = optim.global_norm(g)
    ascended = {k: state.params[k] + g[k] * rho / (norm + 1e-12) for k in g}
    expected = _grads_at(model, ascended, batch)
    for k in expected:
        torch.testing.assert_close(
            state.params[k] - new.params[k], expected[k], rtol=1e-4, atol=1e-6
        )


def test_interval_runs_sam_only_on_every_kth_step():
    model, batches = mlp(), regression_batches(4)
    opt = optim.sgd(0.1)
    state = functrain.init(model, opt)
    plain = make(model, mse_loss, lambda: [], opt)
    every3 = make(model, mse_loss, lambda: [sam(rho=0.5, interval=3)], opt)
    differs = []
    for batch in batches:
        plain_next, _ = plain(state, batch)
        sam_next, _ = every3(state, batch)  # same input state: only this step's rule differs
        differs.append(not tree_allclose(plain_next.params, sam_next.params))
        state = plain_next
    assert differs == [False, False, True, False]  # (step + 1) % 3 == 0 at step 2


def test_reports_the_loss_at_the_unperturbed_weights():
    model, batch = mlp(), regression_batches(1)[0]
    opt = optim.sgd(0.1)
    state = functrain.init(model, opt)
    _, m_plain = make(model, mse_loss, lambda: [], opt)(state, batch)
    _, m_sam = make(model, mse_loss, lambda: [sam(rho=0.5)], opt)(state, batch)
    assert float(m_plain["loss"]) == float(m_sam["loss"])


def test_pure_and_resumable():
    model, batches = mlp(), regression_batches(4)
    state = functrain.init(model, optim.adamw(1e-2))

    def factory():
        return [sam(rho=0.1, interval=2)]

    assert_pure(make(model, mse_loss, factory, optim.adamw(1e-2)), state, batches[0])
    assert_resume_exact(model, mse_loss, factory, state, batches, opt=optim.adamw(1e-2))


def test_bad_arguments():
    with pytest.raises(ValueError, match="rho"):
        sam(rho=-1.0)
    with pytest.raises(ValueError, match="interval"):
        sam(interval=0)
