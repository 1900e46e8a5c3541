"""Selective backprop: when it runs, which examples it keeps (hard ones likelier), determinism."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.selective_backprop import (
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
