"""Batch helpers: counting and splitting."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.data import num_samples
from functrain.step.batching import split_batch


@settings(max_examples=30, deadline=None)
@given(total=st.integers(1, 40), size=st.integers(1, 50))
def test_split_covers_the_batch_in_order(total, size):
    batch = {"x": torch.arange(total), "meta": "keep", "y": torch.arange(total) * 2}
    parts = split_batch(batch, size)
    assert all(num_samples(p) <= size for p in parts)
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert all(p["meta"] == "keep" for p in parts)


def test_no_tensor_is_a_clear_error():
    with pytest.raises(ValueError, match="no tensor"):
        num_samples(("a", 1))
