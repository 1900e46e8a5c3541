"""Resolving target markers in the loss: one forward, any order, dense vs loss interpolation."""

import pytest
import torch
import torch.nn.functional as F
from data_algo_testing import ce_loss, digits_batches, setup

from functrain.algorithms.label_smoothing import label_smoothing
from functrain.algorithms.mixed_targets import (
    MixedTarget,
    SmoothedTarget,
    dense_target,
    resolving_loss,
)
from functrain.algorithms.mixup import mixup
from functrain.step.batching import split_batch
from functrain.step.make import normalize_loss
from functrain.step.model_calls import ModelCalls


class CountingLinear(torch.nn.Linear):
    calls = 0

    def forward(self, x):
        CountingLinear.calls += 1
        return super().forward(x)


def _inner(model, batch):
    return normalize_loss(ce_loss(model, batch))


def test_markers_resolve_to_composer_targets_and_interpolated_losses():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y, y2 = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]), torch.tensor([2, 2, 0, 1, 0])
    out = model(x)
    loss = resolving_loss(_inner, target_key=1)
    dense = MixedTarget(y, y2, 0.7, 0.3, interpolate_loss=False)
    expected_dense = F.cross_entropy(
        out, 0.7 * F.one_hot(y, 3).float() + 0.3 * F.one_hot(y2, 3).float()
    )
    assert torch.allclose(loss(model, (x, dense))[0], expected_dense)
    interp = MixedTarget(y, y2, 0.7, 0.3, interpolate_loss=True)
    expected_interp = 0.7 * F.cross_entropy(out, y) + 0.3 * F.cross_entropy(out, y2)
    assert torch.allclose(loss(model, (x, interp))[0], expected_interp)
    smoothed = SmoothedTarget(interp, 0.1)  # smoothing a mix: the dense smoothed mixture
    expected = F.cross_entropy(out, dense_target(smoothed, out))
    assert torch.allclose(loss(model, (x, smoothed))[0], expected)
    _, aux = loss(model, (x, dense))
    assert torch.equal(aux["accuracy"], (out.argmax(1) == y).float().mean())  # original targets


def test_the_forward_pass_runs_once_for_any_number_of_loss_terms():
    model = CountingLinear(4, 3)
    x = torch.randn(6, 4)
    y = torch.randint(0, 3, (6,))
    target = MixedTarget(
        SmoothedTarget(y, 0.1), MixedTarget(y, y.flip(0), 0.5, 0.5, True), 0.6, 0.4, True
    )
    CountingLinear.calls = 0
    resolving_loss(_inner, 1)(model, (x, target))
    assert CountingLinear.calls == 1
    proxy = ModelCalls(model)
    proxy(x)
    proxy.replay()
    proxy(x + 1)  # different arguments are not replayed
    assert CountingLinear.calls == 3


def test_label_smoothing_and_mixup_commute():
    batches = digits_batches(2)
    losses = []
    for algorithms in ([label_smoothing(0.1), mixup(0.4)], [mixup(0.4), label_smoothing(0.1)]):
        step, state = setup(algorithms)
        _, metrics = step(state, batches[0])
        losses.append(metrics["loss"])
    assert torch.allclose(losses[0], losses[1], atol=1e-6)


def test_markers_split_with_microbatches():
    y = torch.arange(6)
    batch = (torch.randn(6, 2), MixedTarget(y, y.flip(0), 0.8, 0.2, False))
    first, second = split_batch(batch, 3)
    assert torch.equal(first[1].permuted, torch.tensor([5, 4, 3]))
    assert second[1].original_weight == 0.8 and second[1].interpolate_loss is False


def test_a_loss_that_cannot_take_dense_targets_gets_an_actionable_error():
    def index_only_metrics(model, batch):
        x, y = batch
        out = model(x)
        return F.cross_entropy(out, y), {"accuracy": (out.argmax(1) == y).float().mean()}

    step, state = setup([mixup(0.4)], loss_fn=index_only_metrics)
    with pytest.raises(RuntimeError, match="interpolate_loss=True"):
        step(state, digits_batches(1)[0])
    step, state = setup([mixup(0.4, interpolate_loss=True)], loss_fn=index_only_metrics)
    _, metrics = step(state, digits_batches(1)[0])  # loss interpolation keeps index targets
    assert torch.isfinite(metrics["loss"])
