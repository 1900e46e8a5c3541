"""colout_batch: drops the same rows/columns from all images (and same-size targets), in order."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.colout import colout_batch


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    p_row=st.floats(0.0, 1.0),
    p_col=st.floats(0.0, 1.0),
    seed=st.integers(0, 10**6),
)
def test_kept_rows_and_columns_are_an_ordered_subset(h, w, p_row, p_col, seed):
    rows = torch.arange(h, dtype=torch.float32).view(1, 1, h, 1).expand(2, 3, h, w)
    cols = torch.arange(w, dtype=torch.float32).view(1, 1, 1, w).expand(2, 3, h, w)
    x = rows * 100 + cols
    target = x[:, 0].clone()  # an image-shaped target: cut alike ("auto")
    gen = torch.Generator().manual_seed(seed)
    out, out_target = colout_batch((x, target), p_row, p_col, generator=gen)
    assert out.shape == (2, 3, int((1 - p_row) * h), int((1 - p_col) * w))
    kept_rows = (out[0, 0, :, 0] // 100).tolist() if out.numel() else []
    assert kept_rows == sorted(set(kept_rows))  # distinct, original order
    assert bool((out == out[:1, :1]).all())  # the same cut for every image and channel
    assert torch.equal(out_target, out[:, 0])
    again = colout_batch((x, target), p_row, p_col, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(again[0], out)


def test_zero_drop_is_the_identity_and_class_targets_are_left_alone():
    x, y = torch.rand(2, 1, 5, 5), torch.tensor([1, 2])
    out, out_y = colout_batch((x, y), 0.0, 0.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, x) and out_y is y
    explicit = colout_batch(x, kept_rows=[0, 4], kept_cols=[2])
    assert torch.equal(explicit, x[..., [0, 4], :][..., [2]])
    with pytest.raises(ValueError, match="p_row"):
        colout_batch(x, p_row=1.5)
    with pytest.raises(ValueError, match="resize_target"):
        colout_batch((x, x), resize_target="sometimes", generator=torch.Generator())
