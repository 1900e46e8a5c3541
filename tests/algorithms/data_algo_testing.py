"""Shared fixtures for the data-algorithm tests: a tiny CNN on digit-like images, runs, resume.

Not a test module (no `test_` prefix); the algorithm tests import it by name (pytest puts this
directory on sys.path).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import functrain
from functrain import optim
from functrain.tree import tree_clone


class TinyCNN(torch.nn.Module):
    """Conv + BatchNorm + global pooling: accepts any image size (resizing, ColOut)."""

    def __init__(self, channels: int = 1, classes: int = 10):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, classes)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def ce_loss(model, batch):
    """Cross-entropy with an accuracy metric that accepts index or probability targets."""
    x, y = batch
    out = model(x)
    labels = y.argmax(1) if y.dim() == out.dim() else y
    return F.cross_entropy(out, y), {"accuracy": (out.argmax(1) == labels).float().mean()}


@functools.lru_cache(maxsize=1)
def _blobs(n: int = 256, classes: int = 10):
    # A learnable digits-like task without sklearn's import cost: each class is a fixed random
    # 8x8 pattern, each sample that pattern plus noise, values in [0, 1].
    gen = torch.Generator().manual_seed(1234)
    patterns = torch.rand(classes, 1, 8, 8, generator=gen)
    labels = torch.randint(0, classes, (n,), generator=gen)
    noise = 0.3 * torch.randn(n, 1, 8, 8, generator=gen)
    return (patterns[labels] + noise).clamp(0, 1), labels


def digits_batches(
    n_batches: int = 4, batch_size: int = 32
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n_batches` fixed batches of 8x8 one-channel images in [0, 1] with 10 classes."""
    images, labels = _blobs()
    return [
        (
            images[i * batch_size : (i + 1) * batch_size],
            labels[i * batch_size : (i + 1) * batch_size],
        )
        for i in range(n_batches)
    ]


def setup(
    algorithms=(), *, max_batches: int = 10, seed: int = 0, loss_fn=ce_loss, lr=1e-2, **step_options
):
    """`(step, state)` for TinyCNN with `algorithms` composed and the run's horizon set."""
    torch.manual_seed(seed)
    model = TinyCNN()
    opt = optim.adamw(lr=lr)
    state = functrain.init(model, opt, seed=seed)
    state = state.replace(
        timestamp=state.timestamp.replace(max_batches=max_batches, batches_per_epoch=max_batches)
    )
    step = functrain.compose(functrain.make_step(model, loss_fn, opt, **step_options), *algorithms)
    return step, state


def run(step, state, batches, n_steps: int):
    """`n_steps` steps cycling over `batches`; returns the state and the per-step losses."""
    losses = []
    for _ in range(n_steps):
        state, metrics = step(state, batches[state.step % len(batches)])
        losses.append(float(metrics["loss"]))
    return state, losses


def eval_loss(step, state, batch) -> float:
    """Plain cross-entropy of the state's model on `batch` (no algorithm involved)."""
    x, y = batch
    out = step.call_model(state.replace(buffers=tree_clone(state.buffers)), x)
    return float(F.cross_entropy(out, y))


def assert_trains(algorithm_factory, n_steps: int = 8, batches=None, held_out=None):
    """A few steps with the algorithm: finite losses, and a lower loss on held-out data after."""
    batches = batches or digits_batches(3)
    held_out = held_out or digits_batches(4)[3]
    step, state = setup([algorithm_factory()], max_batches=n_steps, lr=5e-2)
    before = eval_loss(step, state, held_out)
    state, losses = run(step, state, batches, n_steps)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    after = eval_loss(step, state, held_out)
    assert after < before, (before, after)
    return losses


def assert_resumes_exactly(algorithm_factory, n_steps: int = 4, batches=None, **setup_options):
    """N steps uninterrupted == N/2 steps, clone the state, N/2 more with a freshly built step."""
    batches = batches or digits_batches(3)
    step, state0 = setup([algorithm_factory()], max_batches=n_steps, **setup_options)
    full, _ = run(step, tree_clone(state0), batches, n_steps)
    half, _ = run(step, tree_clone(state0), batches, n_steps // 2)
    resumed_from = tree_clone(half)
    fresh_step, _ = setup([algorithm_factory()], max_batches=n_steps, **setup_options)
    resumed, _ = run(fresh_step, resumed_from, batches, n_steps - n_steps // 2)
    assert resumed.step == full.step
    for name in full.params:
        assert torch.equal(resumed.params[name], full.params[name]), name
    for name in full.buffers:
        assert torch.equal(resumed.buffers[name], full.buffers[name]), name


def assert_zero_strength_is_identity(algorithm, n_steps: int = 3, batches=None):
    """Composing `algorithm` (at zero strength) changes no bit of the trained parameters."""
    batches = batches or digits_batches(3)
    plain_step, state = setup([], max_batches=n_steps)
    algo_step, _ = setup([algorithm], max_batches=n_steps)
    plain, _ = run(plain_step, tree_clone(state), batches, n_steps)
    with_algo, _ = run(algo_step, tree_clone(state), batches, n_steps)
    for name in plain.params:
        assert torch.equal(plain.params[name], with_algo.params[name]), name


def recording_loss(seen: list):
    """A `ce_loss` that records each batch it is called with (to inspect what the step trains on)."""

    def loss(model, batch):
        seen.append(batch)
        return ce_loss(model, batch)

    return loss
