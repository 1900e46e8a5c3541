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


def test_index_equal_to_num_classes_is_out_of_range_by_default():
    with pytest.raises(ValueError, match="class index 3 is out of range for 3 classes"):
        one_hot(torch.tensor([0, 3]), 3)
    # the default of ensure_targets_one_hot validates too
    with pytest.raises(ValueError, match="out of range"):
        ensure_targets_one_hot(torch.zeros(2, 3), torch.tensor([2, 3]))
    assert torch.equal(one_hot(torch.tensor([2]), 3), torch.tensor([[0, 0, 1]]))


def test_minus_one_is_an_ignored_label_and_the_warning_points_at_the_caller():
    with pytest.warns(UserWarning, match="ignore") as record:
        dense = one_hot(torch.tensor([-1, 0]), 2)
    assert torch.equal(dense, torch.tensor([[0, 0], [1, 0]]))
    assert record[0].filename == __file__  # stacklevel=2: the line that called one_hot


def test_validate_false_skips_the_checks_and_empty_indices_need_none():
    # no warning (warnings are errors in this suite) and no range check without validation
    dense = one_hot(torch.tensor([1, -100]), 3, validate=False)
    assert torch.equal(dense, torch.tensor([[0, 1, 0], [0, 0, 0]]))
    out = ensure_targets_one_hot(torch.zeros(1, 2), torch.tensor([-5]), validate=False)
    assert torch.equal(out, torch.zeros(1, 2))
    # an empty batch validates without reducing over nothing (max of an empty tensor raises)
    empty = one_hot(torch.zeros(0, dtype=torch.long), 4)
    assert empty.shape == (0, 4) and empty.dtype == torch.long


def test_ranks_are_compared_by_value_even_beyond_the_small_int_cache():
    # CPython shares one object per int only up to 256: rank 258 vs 257 + 1 must still match
    outputs, targets = torch.zeros([1] * 258), torch.zeros([1] * 257, dtype=torch.long)
    assert infer_target_type(outputs, targets) == "indices"
    assert infer_target_type(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)) == "indices"
