"""smooth_labels: Composer's formula, a probability distribution, identity at zero strength."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.label_smoothing import smooth_labels


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 8),
    c=st.integers(2, 10),
    smoothing=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
)
def test_smoothed_targets_follow_the_formula_and_stay_distributions(n, c, smoothing, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=gen)
    y = torch.randint(0, c, (n,), generator=gen)
    y_before = y.clone()
    out = smooth_labels(logits, y, smoothing)
    onehot = torch.nn.functional.one_hot(y, c).float()
    assert torch.allclose(out, onehot * (1 - smoothing) + smoothing / c)
    assert torch.allclose(out.sum(1), torch.ones(n), atol=1e-6)
    if smoothing < 1 - 1e-6:  # the true class keeps the largest mass
        assert torch.equal(out.argmax(1), y)
    assert torch.equal(y, y_before)  # pure


def test_zero_smoothing_is_one_hot_and_full_smoothing_is_uniform():
    y = torch.tensor([2, 0])
    assert torch.equal(smooth_labels(torch.zeros(2, 3), y, 0.0), torch.eye(3)[[2, 0]])
    assert torch.allclose(smooth_labels(torch.zeros(2, 3), y, 1.0), torch.full((2, 3), 1 / 3))


def test_dense_and_segmentation_targets():
    probs = torch.tensor([[0.5, 0.5, 0.0]])
    assert torch.allclose(smooth_labels(torch.zeros(1, 3), probs, 0.3), probs * 0.7 + 0.1)
    seg = torch.randint(0, 4, (2, 5, 5))
    out = smooth_labels(torch.zeros(2, 4, 5, 5), seg, 0.2)
    assert out.shape == (2, 4, 5, 5) and torch.allclose(out.sum(1), torch.ones(2, 5, 5))


def test_out_of_range_smoothing_is_rejected():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        smooth_labels(torch.zeros(1, 2), torch.tensor([0]), 1.5)


def test_default_strength_is_composers_point_one_against_torch():
    # torch's cross entropy with label_smoothing=0.1 is an independent implementation of the
    # same targets: the loss against the smoothed targets must equal it.
    gen = torch.Generator().manual_seed(0)
    logits, y = torch.randn(6, 5, generator=gen), torch.randint(0, 5, (6,), generator=gen)
    ours = torch.nn.functional.cross_entropy(logits, smooth_labels(logits, y))
    expected = torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1)
    assert torch.allclose(ours, expected)


@pytest.mark.parametrize("bad", [-0.5, -1e-9, 1.5])
def test_strength_outside_the_unit_interval_is_refused(bad):
    with pytest.raises(ValueError, match="smoothing must be in"):
        smooth_labels(torch.zeros(2, 3), torch.tensor([0, 1]), bad)
