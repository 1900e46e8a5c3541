"""`torch.func.vmap` over the optimizers (issue 28.1, the optimizer side): no foreach kernel runs
under a functorch transform (vmap has no batching rule for them), so N members' updates run in
one vmapped call and equal N separate updates. The states' Python numbers (counts, the lr used)
are not batched: they are passed with in/out dims None (they are the same for every member)."""

from __future__ import annotations

import pytest
import torch

from functrain import optim
from functrain.tree import tree_allclose, tree_map

N = 4

OPTIMIZERS = {
    "sgd": lambda: optim.sgd(0.1, weight_decay=0.01),
    "sgd momentum": lambda: optim.sgd(0.1, momentum=0.9, nesterov=True),
    "decoupled_sgdw": lambda: optim.decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-2),
    "adam": lambda: optim.adam(0.05, weight_decay=0.01),
    "adamw": lambda: optim.adamw(0.05, weight_decay_mask=optim.no_decay_mask),
    "amsgrad": lambda: optim.adamw(0.05, amsgrad=True),
    "decoupled_adamw": lambda: optim.decoupled_adamw(0.05, weight_decay=1e-2),
    "lion": lambda: optim.lion(0.01, weight_decay=0.5),
    "chain(clip, adamw)": lambda: optim.chain(optim.clip_by_global_norm(0.5), optim.adamw(0.05)),
    "inject_hyperparams(sgd)": lambda: optim.inject_hyperparams(optim.sgd)(lr=0.1, momentum=0.9),
    "multi_steps(adam)": lambda: optim.multi_steps(optim.adam(0.05), every_k=2),
    "adamw differentiable": lambda: optim.adamw(0.05, differentiable=True),
}


def member_params(i):
    gen = torch.Generator().manual_seed(i)
    return {"fc.weight": torch.randn(3, 2, generator=gen), "fc.bias": torch.randn(3, generator=gen)}


def stacked(trees):
    return tree_map(lambda *xs: torch.stack(xs), *trees)


def batch_dims(state):
    """0 for each tensor of an optimizer state, None for its Python numbers."""
    return tree_map(lambda x: 0 if isinstance(x, torch.Tensor) else None, state)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_vmapped_init_and_update_equal_one_update_per_member(name):
    opt = OPTIMIZERS[name]()
    members = [member_params(i) for i in range(N)]
    dims = batch_dims(opt.init(members[0]))
    params = stacked(members)
    state = torch.func.vmap(opt.init, out_dims=dims)(params)
    update = torch.func.vmap(
        lambda g, s, p: opt.update(g, s, p), in_dims=(0, dims, 0), out_dims=(0, dims)
    )
    states = [opt.init(m) for m in members]
    gen = torch.Generator().manual_seed(100)
    for _ in range(3):
        grads = [{k: torch.randn(v.shape, generator=gen) for k, v in m.items()} for m in members]
        updates, state = update(stacked(grads), state, params)
        params = optim.apply_updates(params, updates)
        for i in range(N):
            u, states[i] = opt.update(grads[i], states[i], members[i])
            members[i] = optim.apply_updates(members[i], u)
    assert tree_allclose(params, stacked(members), atol=1e-6, rtol=1e-6)
    for i in range(N):
        member_state = tree_map(lambda x, i=i: x[i] if isinstance(x, torch.Tensor) else x, state)
        assert tree_allclose(member_state, states[i], atol=1e-6, rtol=1e-6)
