"""Selective backprop: when it runs, which examples it keeps (hard ones likelier), determinism."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.selective_backprop import (
    per_example_losses,
    select_indices_using_loss,
    select_using_loss,
    selection_probabilities,
    should_selective_backprop,
)


@settings(max_examples=50, deadline=None)
@given(
    t=st.floats(0, 1),
    idx=st.integers(0, 100),
    start=st.floats(0, 1),
    end=st.floats(0, 1),
    interrupt=st.integers(0, 5),
)
def test_runs_inside_the_interval_except_on_interrupt_batches(t, idx, start, end, interrupt):
    result = should_selective_backprop(t, idx, start, end, interrupt)
    expected = start <= t < end and (interrupt == 0 or (idx + 1) % interrupt != 0)
    assert result == expected


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), keep=st.floats(0.05, 1.0), seed=st.integers(0, 10**6))
def test_selection_keeps_int_keep_n_distinct_examples_and_is_keyed(n, keep, seed):
    losses = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    if int(keep * n) == 0:
        with pytest.raises(ValueError, match="keeps no example"):
            select_indices_using_loss(losses, keep, generator=torch.Generator())
        return
    picked = select_indices_using_loss(losses, keep, generator=torch.Generator().manual_seed(seed))
    assert picked.numel() == int(keep * n) and picked.unique().numel() == picked.numel()
    again = select_indices_using_loss(losses, keep, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(picked, again)
    probs = selection_probabilities(n, keep)
    assert abs(float(probs.sum()) - 1) < 1e-9 and bool((probs[1:] >= probs[:-1]).all())


def test_hard_examples_are_kept_more_often():
    losses = torch.arange(100, dtype=torch.float32)  # example i has rank i
    counts = torch.zeros(100)
    for seed in range(50):
        counts[
            select_indices_using_loss(losses, 0.25, generator=torch.Generator().manual_seed(seed))
        ] += 1
    assert counts[75:].sum() > 3 * counts[:25].sum()


def test_select_using_loss_scores_with_the_model_and_prunes_both():
    x = torch.randn(8, 3, 4, 4)
    y = torch.randint(0, 5, (8,))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(5))
    model(x)
    new_x, new_y = select_using_loss(
        x, y, model, F.cross_entropy, keep=0.5, generator=torch.Generator().manual_seed(0)
    )
    assert new_x.shape == (4, 3, 4, 4) and new_y.shape == (4,)
    small = torch.nn.Sequential(
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 5)
    )
    new_x, _ = select_using_loss(
        x, y, small, F.cross_entropy, 0.5, 0.5, generator=torch.Generator()
    )
    assert new_x.shape == (4, 3, 4, 4)  # full-size inputs are kept; scoring ran downsampled
    with pytest.raises(TypeError, match="reduction"):
        select_using_loss(
            x, y, model, lambda out, t: F.cross_entropy(out, t), generator=torch.Generator()
        )


def test_the_default_interval_and_interrupt():
    # defaults: start 0.5, end 0.9, every 2nd batch (batch_idx 1, 3, ...) a normal one
    assert should_selective_backprop(0.5, 0) and should_selective_backprop(0.89, 2)
    assert not should_selective_backprop(0.49, 0) and not should_selective_backprop(0.9, 0)
    assert not should_selective_backprop(0.6, 1) and not should_selective_backprop(0.6, 3)


@pytest.mark.parametrize(
    "interrupt, pruned",
    [(0, [1, 1, 1, 1, 1, 1]), (1, [0] * 6), (2, [1, 0, 1, 0, 1, 0]), (3, [1, 1, 0, 1, 1, 0])],
)
def test_every_interrupt_th_batch_counting_from_one_is_normal(interrupt, pruned):
    got = [int(should_selective_backprop(0.6, i, 0.5, 0.9, interrupt)) for i in range(6)]
    assert got == pruned


@pytest.mark.parametrize("keep", [0.0, -0.5, 1.5])
def test_keep_outside_0_1_is_refused(keep):
    with pytest.raises(ValueError, match=r"keep must be in \(0, 1\]"):
        select_indices_using_loss(torch.rand(8), keep, generator=torch.Generator())


def _scorer(seen):
    """A model that records its input and returns it flat; a loss that returns the outputs."""

    def model(x):
        seen.append(x)
        return x.flatten(1)

    def loss(outputs, targets, reduction):
        assert reduction == "none"
        return outputs

    return model, loss


def test_default_scale_scores_the_inputs_as_they_are_one_mean_loss_per_example():
    x = torch.rand(3, 2, 5)  # per-"token" losses (N, 10): the score is each row's mean
    seen = []
    model, loss = _scorer(seen)
    got = per_example_losses(x, None, model, loss)
    assert seen[0] is x
    torch.testing.assert_close(got, torch.stack([row.mean() for row in x]))
    exact = per_example_losses(x[:, 0, 0], None, lambda v: v, lambda o, t, reduction: o * 2)
    torch.testing.assert_close(exact, x[:, 0, 0] * 2)  # one loss per example: kept as it is


@pytest.mark.parametrize("spatial", [(4,), (4, 6), (2, 4, 6)], ids=["linear", "bilinear", "3d"])
def test_half_scale_scoring_averages_neighbour_pairs_as_interpolate_without_corners(spatial):
    # at scale 1/2 with align_corners=False each output sample lies midway between two inputs
    # per axis, so linear/bilinear/trilinear interpolation is the mean of each 2x..x2 block
    x = torch.rand(2, 3, *spatial, dtype=torch.float64)
    seen = []
    model, loss = _scorer(seen)
    per_example_losses(x, None, model, loss, scale_factor=0.5)
    blocks = x
    for axis in range(2, x.dim()):
        blocks = blocks.unflatten(axis, (-1, 2)).mean(axis + 1)
    torch.testing.assert_close(seen[0], blocks)


def test_a_loss_with_var_keywords_is_accepted_and_one_without_reduction_refused():
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])

    def loss(outputs, targets, **kwargs):
        return F.cross_entropy(outputs, targets, **kwargs)

    got = per_example_losses(x, y, lambda v: v, loss)
    torch.testing.assert_close(got, -torch.log_softmax(x, 1)[torch.arange(4), y])
    with pytest.raises(TypeError, match="must take a `reduction` keyword"):
        per_example_losses(x, y, lambda v: v, lambda out, t: F.cross_entropy(out, t))


def test_selection_probabilities_by_hand():
    # ranks at percentiles (i + 1/2) / n, weighted by p ** (1 / keep - 1), normalised
    p = torch.tensor([0.125, 0.375, 0.625, 0.875], dtype=torch.float64)
    torch.testing.assert_close(selection_probabilities(4, 0.5), p / p.sum())
    torch.testing.assert_close(selection_probabilities(4, 0.25), p**3 / (p**3).sum())
    torch.testing.assert_close(selection_probabilities(4, 1.0), torch.full((4,), 0.25).double())


@pytest.mark.parametrize("scale", [1.5, 0.0, -0.5, float("nan")])
def test_a_scale_outside_0_1_or_nan_is_refused(scale):
    with pytest.raises(ValueError, match=r"scale_factor must be in \(0, 1\]"):
        per_example_losses(
            torch.rand(2, 1, 4, 4), None, lambda v: v, lambda o, t, reduction: o, scale
        )


def test_select_using_loss_keeps_half_by_default_drawn_by_loss_rank():
    x = torch.tensor([3.0, 0.5, 2.0, 9.0, 1.0, 7.0, 4.0, 6.0]).view(8, 1)
    y = torch.arange(8)
    model, loss = (lambda v: v), (lambda out, t, reduction: out.flatten())  # loss = the input
    new_x, new_y = select_using_loss(x, y, model, loss, generator=torch.Generator().manual_seed(3))
    # replay: rank ascending by loss, draw 4 ranks without replacement, weights p ** (1/0.5 - 1)
    ranked = torch.argsort(x.flatten())
    p = (torch.arange(8, dtype=torch.float64) + 0.5) / 8
    picks = torch.multinomial(p / p.sum(), 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(new_y, ranked[picks]) and torch.equal(new_x, x[ranked[picks]])
