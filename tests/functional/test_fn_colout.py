"""colout_batch: drops the same rows/columns from all images (and same-size targets), in order."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.colout import colout_batch, should_resize_target


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


def test_auto_resizes_only_an_image_sized_second_item_of_a_tuple():
    x = torch.rand(5, 3, 5, 5)
    seg = torch.rand(5, 5, 5)  # (N, H, W) segmentation target
    assert should_resize_target((x, seg), "auto")
    assert should_resize_target([x, seg, torch.arange(5)], "auto")  # extra items are ignored
    # one-hot class targets (N, C) whose shape happens to be the images' (H, W): left alone
    assert not should_resize_target((x, torch.eye(5)), "auto")
    assert not should_resize_target((x, torch.rand(5, 4, 5)), "auto")  # another spatial size
    assert not should_resize_target((x, torch.rand(5, 3, 4, 4)), "auto")
    # not a pair: a bare batch tensor, a one-item tuple, a pair of equal-length vectors
    assert not should_resize_target(x, "auto")
    assert not should_resize_target((x,), "auto")
    assert not should_resize_target((torch.zeros(4), torch.zeros(4)), "auto")
    assert should_resize_target(x, True) and not should_resize_target((x, seg), False)


def test_one_hot_targets_shaped_like_the_image_are_not_cut():
    x = torch.arange(25.0).view(1, 1, 5, 5).expand(5, 1, 5, 5)
    y = torch.eye(5)
    out, out_y = colout_batch((x, y), kept_rows=[0, 2], kept_cols=[1, 3, 4])
    assert out_y is y
    assert torch.equal(out[0, 0], torch.tensor([[1.0, 3.0, 4.0], [11.0, 13.0, 14.0]]))


def test_a_single_2d_image_is_cut_and_a_1d_tensor_is_refused():
    x = torch.arange(12.0).view(3, 4)
    assert torch.equal(colout_batch(x, kept_rows=[1], kept_cols=[0, 3]), torch.tensor([[4.0, 7.0]]))
    out = colout_batch(x, 0.0, 0.5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, 2)
    with pytest.raises(ValueError, match=r"expects images \(..., H, W\), got shape \(5,\)"):
        colout_batch(torch.zeros(5), generator=torch.Generator())


def test_auto_compares_the_last_two_dimensions_of_any_rank():
    seg = torch.rand(1, 5, 6)
    assert should_resize_target((torch.rand(3, 5, 6), seg), "auto")  # one (C, H, W) image
    video = torch.rand(2, 3, 4, 5, 6)  # (N, C, D, H, W)
    assert should_resize_target((video, torch.rand(2, 4, 5, 6)), "auto")


@pytest.mark.parametrize("p_row, p_col", [(-0.5, 0.1), (0.1, -0.01), (0.1, 1.01)])
def test_drop_fractions_outside_0_1_are_refused(p_row, p_col):
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        colout_batch(torch.rand(1, 1, 4, 4), p_row, p_col, generator=torch.Generator())
