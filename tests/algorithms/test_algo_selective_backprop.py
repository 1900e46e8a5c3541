"""selective_backprop transform: prunes by loss inside its interval, purely; resumes exactly."""

import pytest
import torch
import torch.nn.functional as F
from data_algo_testing import assert_resumes_exactly, assert_trains, digits_batches, setup

from functrain.algorithms.label_smoothing import label_smoothing
from functrain.algorithms.selective_backprop import selective_backprop
from functrain.functional.batch import take
from functrain.functional.selective_backprop import select_indices_using_loss
from functrain.rng import key_for
from functrain.tree import tree_clone


def test_keeps_the_loss_ranked_draw_of_the_functional_core():
    step, state = setup(
        [selective_backprop(start=0.0, end=1.0, keep=0.5, interrupt=0)], max_batches=10
    )
    x, y = digits_batches(1)[0]
    buffers_before = tree_clone(state.buffers)
    losses = F.cross_entropy(step.call_model(tree_clone(state), x), y, reduction="none")
    expected = select_indices_using_loss(
        losses, 0.5, generator=key_for(state.rng, 0, "selective_backprop")
    )
    new_x, new_y = step.pieces.prepare(state, (x, y))
    assert torch.equal(new_x, take(x, expected)) and torch.equal(new_y, y[expected])
    for name, value in state.buffers.items():  # the scoring pass left the state alone
        assert torch.equal(value, buffers_before[name])
    _, metrics = step(state, (x, y))
    assert metrics["samples"] == 16


def test_runs_only_inside_the_interval_and_off_the_interrupt_batches():
    step, state = setup(
        [selective_backprop(start=0.5, end=0.9, keep=0.5, interrupt=2)], max_batches=10
    )
    batch = digits_batches(1)[0]
    for b in range(10):
        ts = state.timestamp.replace(batch=b, batch_in_epoch=b)
        new_x, _ = step.pieces.prepare(state.replace(timestamp=ts), batch)
        pruned = 5 <= b < 9 and (b + 1) % 2 != 0
        assert new_x.shape[0] == (16 if pruned else 32), b


def test_needs_the_real_targets():
    step, state = setup(
        [label_smoothing(0.1), selective_backprop(start=0.0, interrupt=0)], max_batches=4
    )
    with pytest.raises(ValueError, match="before those algorithms"):
        step.pieces.prepare(state, digits_batches(1)[0])


def test_trains_and_resumes_exactly():
    assert_trains(lambda: selective_backprop(start=0.0, end=1.0, interrupt=0))
    assert_resumes_exactly(
        lambda: selective_backprop(start=0.0, end=1.0, interrupt=2, scale_factor=0.5)
    )
