"""Index vs dense targets: one-hot encoding at the class dimension, shape inference, errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.targets import (
    check_for_index_targets,
    ensure_targets_one_hot,
    infer_target_type,
    one_hot,
)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), c=st.integers(1, 7), extra=st.integers(0, 2), seed=st.integers(0, 99))
def test_one_hot_matches_torch_with_the_class_dimension_at_1(n, c, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) + (3,) * extra
    y = torch.randint(0, c, shape, generator=gen)
    outputs = torch.zeros((n, c) + (3,) * extra)
    dense = ensure_targets_one_hot(outputs, y)
    assert dense.shape == outputs.shape and dense.dtype == torch.float32
    expected = torch.nn.functional.one_hot(y, c).movedim(-1, 1).float()
    assert torch.equal(dense, expected)
    assert torch.equal(dense.argmax(1), y)


def test_dense_targets_pass_through_as_float():
    probs = torch.tensor([[0.2, 0.8]], dtype=torch.float64)
    out = ensure_targets_one_hot(torch.zeros(1, 2), probs)
    assert out.dtype == torch.float32 and torch.allclose(out, probs.float())
    assert infer_target_type(torch.zeros(1, 2), probs) == "one_hot"
    assert check_for_index_targets(torch.tensor([1])) and not check_for_index_targets(probs)


def test_negative_indices_are_ignored_rows_and_bad_shapes_are_explained():
    with pytest.warns(UserWarning, match="ignore"):
        dense = one_hot(torch.tensor([1, -100]), 3)
    assert torch.equal(dense, torch.tensor([[0, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="out of range"):
        one_hot(torch.tensor([5]), 3)
    with pytest.raises(ValueError, match="cannot tell"):
        ensure_targets_one_hot(torch.zeros(2, 3), torch.zeros(2, 4, 5, dtype=torch.long))
