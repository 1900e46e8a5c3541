"""Shared helpers for the gradient/weights/surgery algorithm tests: tiny models, data, resume checks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import functrain
from functrain import optim
from functrain.tree import tree_allclose, tree_clone


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def mse_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def ce_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def regression_batches(n: int, batch_size: int = 8, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, 4, generator=g), torch.randn(batch_size, 3, generator=g))
        for _ in range(n)
    ]


def image_batches(n: int, batch_size: int = 8, size: int = 8, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch_size, 1, size, size, generator=g),
            torch.randint(0, 10, (batch_size,), generator=g),
        )
        for _ in range(n)
    ]


def with_horizon(state, max_batches: int, batches_per_epoch: int = 0):
    return state.replace(
        timestamp=state.timestamp.replace(
            max_batches=max_batches, batches_per_epoch=batches_per_epoch
        )
    )


def run(step, state, batches, *, batches_per_epoch: int = 0):
    """Run `step` over `batches`, advancing epochs like the loop does when they are set."""
    metrics = None
    for batch in batches:
        state, metrics = step(state, batch)
        ts = state.timestamp
        if batches_per_epoch and ts.batch_in_epoch >= batches_per_epoch:
            state = state.replace(timestamp=ts.advance_epoch())
    return state, metrics


def make(model, loss_fn, algorithms_factory, opt=None, **step_kwargs):
    opt = opt or optim.sgd(0.05, momentum=0.9)
    step = functrain.make_step(model, loss_fn, opt, **step_kwargs)
    return functrain.compose(step, *algorithms_factory())


def assert_resume_exact(
    model, loss_fn, algorithms_factory, state, batches, *, batches_per_epoch=0, opt=None
):
    """N steps in one go == N/2 steps, a copied state, a freshly built step and N/2 more (bitwise)."""
    full, _ = run(
        make(model, loss_fn, algorithms_factory, opt),
        tree_clone(state),
        batches,
        batches_per_epoch=batches_per_epoch,
    )
    half = len(batches) // 2
    first, _ = run(
        make(model, loss_fn, algorithms_factory, opt),
        tree_clone(state),
        batches[:half],
        batches_per_epoch=batches_per_epoch,
    )
    resumed, _ = run(
        make(model, loss_fn, algorithms_factory, opt),
        tree_clone(first),
        batches[half:],
        batches_per_epoch=batches_per_epoch,
    )
    assert tree_allclose(full, resumed), "a resumed run diverged from the uninterrupted one"
    return full


def assert_pure(step, state, batch):
    """The step leaves its input state and batch untouched."""
    before, batch_before = tree_clone(state), tree_clone(batch)
    step(state, batch)
    assert tree_allclose(state, before), "the step modified its input state"
    assert tree_allclose(batch, batch_before), "the step modified its input batch"


def states_equal(a, b) -> bool:
    return tree_allclose(a, b)
