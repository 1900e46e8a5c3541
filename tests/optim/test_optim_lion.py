"""lion matches a straightforward per-tensor implementation of the paper's update."""

import pytest
import torch

from functrain.optim import ScaleByLionState, lion, scale_by_lion


def _reference_lion(model_params, grads_fn, steps, lr, b1, b2, wd):
    params = {k: v.clone() for k, v in model_params.items()}
    mu = {k: torch.zeros_like(v) for k, v in params.items()}
    for t in range(steps):
        grads = grads_fn(params, t)
        for k, g in grads.items():
            direction = torch.sign(b1 * mu[k] + (1 - b1) * g)
            params[k] = params[k] * (1 - lr * wd) - lr * direction
            mu[k] = b2 * mu[k] + (1 - b2) * g
    return params


def test_lion_matches_reference_on_digits(digits, train_functional, max_diff):
    x, y, batches = digits
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10)
    ).double()
    init = {k: v.detach().clone() for k, v in model.named_parameters()}

    def grads_fn(params, t):
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        out = torch.func.functional_call(model, leaves, (x[batches[t]],))
        loss = torch.nn.functional.cross_entropy(out, y[batches[t]])
        return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    ref = _reference_lion(init, grads_fn, len(batches), 3e-4, 0.9, 0.99, 0.1)
    for donate in (False, True):
        got = train_functional(lion(3e-4, weight_decay=0.1), donate=donate)
        assert max_diff(got, ref) <= 1e-6


def test_lion_update_is_a_sign():
    t = scale_by_lion()
    g = {"w": torch.tensor([0.3, -2.0, 0.0])}
    updates, state = t.update(g, t.init(g))
    assert torch.equal(updates["w"], torch.tensor([1.0, -1.0, 0.0]))
    assert isinstance(state, ScaleByLionState) and state.count == 1
    assert torch.allclose(state.mu["w"], 0.01 * g["w"])


def test_lion_bad_beta():
    with pytest.raises(ValueError, match="beta1"):
        lion(betas=(1.5, 0.99))
