"""Differentiable updates (issue 28.2): `differentiable=True` on every optimizer makes `update`
and `apply_updates` autograd ops, so a hypergradient through k inner steps equals finite
differences; the values are those of the ordinary update."""

from __future__ import annotations

import pytest
import torch

import functrain
from functrain import optim
from functrain.tree import tree_allclose

OPTIMIZERS = {
    "sgd": lambda d: optim.sgd(0.1, weight_decay=0.01, differentiable=d),
    "sgd nesterov": lambda d: optim.sgd(0.1, momentum=0.9, nesterov=True, differentiable=d),
    "sgd dampened": lambda d: optim.sgd(0.1, momentum=0.9, dampening=0.1, differentiable=d),
    "decoupled_sgdw": lambda d: optim.decoupled_sgdw(
        0.1, momentum=0.9, weight_decay=1e-2, differentiable=d
    ),
    "adam": lambda d: optim.adam(0.05, weight_decay=0.01, differentiable=d),
    "adamw": lambda d: optim.adamw(
        0.05, weight_decay=0.1, weight_decay_mask=optim.no_decay_mask, differentiable=d
    ),
    "amsgrad": lambda d: optim.adamw(0.05, amsgrad=True, differentiable=d),
    "decoupled_adamw": lambda d: optim.decoupled_adamw(0.05, weight_decay=1e-2, differentiable=d),
    "lion": lambda d: optim.lion(0.01, weight_decay=0.5, differentiable=d),
    "inject_hyperparams(adamw)": lambda d: optim.inject_hyperparams(optim.adamw)(
        lr=0.05, weight_decay=0.1, differentiable=d
    ),
    "chain(clip, adam)": lambda d: optim.base.maybe_differentiable(
        optim.chain(optim.clip_by_global_norm(0.5), optim.adam(0.05)), d
    ),
    "masked(adamw)": lambda d: optim.base.maybe_differentiable(
        optim.masked(optim.adamw(0.05), {"w": True, "b": False}), d
    ),
    "multi_steps(sgd)": lambda d: optim.base.maybe_differentiable(
        optim.multi_steps(optim.sgd(0.1, momentum=0.9), every_k=2), d
    ),
}

GEN = torch.Generator().manual_seed(0)
X_IN, Y_IN = (
    torch.randn(16, 3, generator=GEN, dtype=torch.float64),
    torch.randn(16, 2, generator=GEN, dtype=torch.float64),
)
X_OUT, Y_OUT = (
    torch.randn(16, 3, generator=GEN, dtype=torch.float64),
    torch.randn(16, 2, generator=GEN, dtype=torch.float64),
)


def loss(params, x, y):
    return ((torch.tanh(x @ params["w"]) + params["b"] - y) ** 2).mean()


def meta_loss(opt, start, steps=3):
    """The outer loss after `steps` differentiable inner steps from `start`."""
    params, state = dict(start), opt.init(start)
    for _ in range(steps):
        grads = torch.autograd.grad(
            loss(params, X_IN, Y_IN), list(params.values()), create_graph=True
        )
        updates, state = opt.update(dict(zip(params, grads)), state, params)
        params = optim.apply_updates(params, updates)
    return loss(params, X_OUT, Y_OUT)


def start_params(requires_grad=False):
    gen = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(3, 2, generator=gen, dtype=torch.float64).requires_grad_(requires_grad),
        "b": torch.randn(2, generator=gen, dtype=torch.float64).requires_grad_(requires_grad),
    }


def moved(start, direction, eps):
    return {k: (v.detach() + eps * direction[k]).requires_grad_(True) for k, v in start.items()}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_hypergradient_through_three_updates_equals_finite_differences(name):
    opt = OPTIMIZERS[name](True)
    start = start_params(requires_grad=True)
    grads = torch.autograd.grad(meta_loss(opt, start), list(start.values()))
    assert any(g.abs().sum() > 0 for g in grads)
    gen = torch.Generator().manual_seed(2)
    eps = 1e-6
    for _ in range(3):  # directional derivatives along random directions
        direction = {
            k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in start.items()
        }
        with torch.enable_grad():
            plus = meta_loss(opt, moved(start, direction, eps))
            minus = meta_loss(opt, moved(start, direction, -eps))
        numeric = ((plus - minus) / (2 * eps)).item()
        analytic = sum((g * direction[k]).sum() for g, k in zip(grads, start)).item()
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8), name


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_differentiable_update_gives_the_ordinary_values(name):
    plain, tracked = OPTIMIZERS[name](False), OPTIMIZERS[name](True)
    params = start_params()
    plain_params, plain_state = dict(params), plain.init(params)
    tracked_params, tracked_state = start_params(requires_grad=True), tracked.init(params)
    for _ in range(3):
        grads = {
            k: torch.randn(v.shape, generator=GEN, dtype=torch.float64) for k, v in params.items()
        }
        updates, plain_state = plain.update(dict(grads), plain_state, plain_params)
        plain_params = optim.apply_updates(plain_params, updates)
        grads = {k: g.requires_grad_(True) for k, g in grads.items()}  # as with create_graph
        updates, tracked_state = tracked.update(dict(grads), tracked_state, tracked_params)
        tracked_params = optim.apply_updates(tracked_params, updates)
    assert all(v.grad_fn is not None for v in tracked_params.values())  # on the tape
    assert tree_allclose(tracked_params, plain_params, atol=1e-12, rtol=1e-12)
    assert tree_allclose(tracked_state, plain_state, atol=1e-12, rtol=1e-12)


def test_an_ordinary_update_stays_off_the_tape():
    params = start_params(requires_grad=True)
    opt = optim.adamw(0.05)
    grads = {k: torch.ones_like(v) for k, v in params.items()}
    updates, _ = opt.update(grads, opt.init(params), params)
    new = optim.apply_updates(params, updates)
    assert all(v.grad_fn is None and v.requires_grad for v in new.values())


def test_a_differentiable_optimizer_has_no_fused_form_and_trains_in_a_step_as_the_plain_one():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    twin = torch.nn.Linear(3, 2)
    twin.load_state_dict(model.state_dict())
    plain, tracked = optim.adamw(0.05), optim.adamw(0.05, differentiable=True)
    params = dict(model.named_parameters())
    assert optim.fused_plan(tracked, params) is None and optim.fused_plan(plain, params) is not None

    def mse(m, batch):
        return ((m(batch[0]) - batch[1]) ** 2).mean()

    states = []
    for module, opt in ((model, plain), (twin, tracked)):
        step = functrain.make_step(module, mse, opt)
        state = functrain.init(module, opt, seed=0)
        for i in range(3):
            state, _ = step(state, (X_IN[i : i + 4].float(), Y_IN[i : i + 4].float()))
        states.append(state)
    assert tree_allclose(states[0].params, states[1].params, atol=1e-6, rtol=1e-6)
