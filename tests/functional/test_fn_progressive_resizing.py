"""Progressive resizing: the scale schedule, pinned widths, resize and crop modes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.progressive_resizing import pin_scale, progressive_scale, resize_batch


@settings(max_examples=50, deadline=None)
@given(
    initial=st.floats(0.0, 1.0),
    finetune=st.floats(0.0, 0.5),
    delay=st.floats(0.0, 0.5),
    t1=st.floats(0.0, 1.0),
    t2=st.floats(0.0, 1.0),
)
def test_scale_is_flat_then_linear_then_full_and_monotone(initial, finetune, delay, t1, t2):
    lo, hi = sorted((t1, t2))
    s_lo = progressive_scale(lo, initial, finetune, delay)
    s_hi = progressive_scale(hi, initial, finetune, delay)
    assert initial - 1e-12 <= s_lo <= s_hi + 1e-12 <= 1 + 1e-12
    if lo < delay:
        assert s_lo == initial
    if hi >= 1 - finetune and hi >= delay:
        assert abs(s_hi - 1) < 1e-9


@settings(max_examples=30, deadline=None)
@given(width=st.integers(4, 64), scale=st.floats(0.05, 1.0), inc=st.integers(1, 8))
def test_pinned_widths_are_multiples_of_the_increment(width, scale, inc):
    pinned = pin_scale(width, scale, inc) * width
    assert abs(pinned - round(pinned)) < 1e-9 and round(pinned) >= min(inc, width)
    if round(pinned) != min(inc, width):
        assert round(pinned) % inc == 0


def test_resize_uses_nearest_neighbour_and_crop_takes_one_shared_window():
    x = torch.arange(64, dtype=torch.float32).view(1, 1, 8, 8).expand(2, 1, 8, 8)
    y = torch.tensor([3, 4])
    small, y_out = resize_batch(x, y, 0.5)
    assert torch.equal(small, x[..., ::2, ::2]) and y_out is y
    crop, _ = resize_batch(x, y, 0.5, mode="crop", generator=torch.Generator().manual_seed(0))
    top, left = int(crop[0, 0, 0, 0]) // 8, int(crop[0, 0, 0, 0]) % 8
    assert torch.equal(crop, x[..., top : top + 4, left : left + 4])
    assert torch.equal(resize_batch(x, y, 1.0)[0], x)  # full scale: identity


def test_segmentation_targets_follow_the_images():
    x = torch.rand(2, 3, 8, 8)
    seg = torch.randint(0, 5, (2, 8, 8))
    _, seg_small = resize_batch(x, seg, 0.5, resize_targets=True)
    assert seg_small.shape == (2, 4, 4) and seg_small.dtype == seg.dtype
    assert torch.equal(seg_small, seg[:, ::2, ::2])
    _, seg_crop = resize_batch(x, seg, 0.5, "crop", True, crop_offset=(2, 3))
    assert torch.equal(seg_crop, seg[:, 2:6, 3:7])
    with pytest.raises(ValueError, match="mode"):
        resize_batch(x, seg, 0.5, mode="zoom")
