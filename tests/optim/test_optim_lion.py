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


def test_lion_betas_count_and_no_graph():
    # b1 = 0.3: direction = sign(0.3 * mu + 0.7 * g), momentum mu <- 0.5 * mu + 0.5 * g (b2 = 0.5)
    t = scale_by_lion(b1=0.3, b2=0.5)
    g1 = {"w": torch.tensor([1.0, -1.0])}
    _, state = t.update(g1, t.init(g1))  # mu = [0.5, -0.5]
    g2 = {"w": torch.tensor([-0.3, 0.3], requires_grad=True)}
    updates, state = t.update(g2, state)
    # 0.3 * 0.5 + 0.7 * -0.3 = -0.06 (a weight of 0.1 on g would give +0.42)
    assert torch.equal(updates["w"], torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(state.mu["w"], torch.tensor([0.1, -0.1]))
    assert state.count == 2
    # gradients that carry autograd history leave none in the update or the state
    assert not updates["w"].requires_grad and not state.mu["w"].requires_grad


def test_lion_defaults_and_a_scheduled_lr():
    params = {"w": torch.tensor([2.0, -3.0])}
    grads = {"w": torch.tensor([0.5, -0.5])}
    opt = lion()  # lr 1e-4, no weight decay: the update is -1e-4 * sign(g)
    updates, _ = opt.update(grads, opt.init(params), params)
    torch.testing.assert_close(updates["w"], torch.tensor([-1e-4, 1e-4]))
    opt = lion(lambda count: 0.1 * (count + 1), weight_decay=0.5)  # a schedule of the count
    state = opt.init(params)
    for count in range(2):
        updates, state = opt.update(grads, state, params)
        lr = 0.1 * (count + 1)  # decoupled decay: -lr * (sign(direction) + 0.5 * w)
        want = -lr * (torch.tensor([1.0, -1.0]) + 0.5 * params["w"])
        torch.testing.assert_close(updates["w"], want)
