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


def test_known_scales_of_the_schedule():
    # the defaults (initial 0.5, finetune 0.2, delay 0.5): the ramp runs from 0.5 to 0.8
    assert progressive_scale(0.3) == 0.5
    assert abs(progressive_scale(0.6) - (0.5 + 0.5 * 0.1 / 0.3)) < 1e-12
    assert progressive_scale(0.8) == 1.0 and progressive_scale(1.0) == 1.0
    # initial 0.25, ramp from 0.5 to 0.8: halfway at 0.65 gives 0.25 + 0.75 / 2
    assert abs(progressive_scale(0.65, 0.25, 0.2, 0.5) - 0.625) < 1e-12
    assert abs(progressive_scale(0.2, 0.4, 0.3, 0.0) - (0.4 + 0.6 * 0.2 / 0.7)) < 1e-12
    # no ramp left (finetune + delay >= 1): full size from the end of the delay on
    assert progressive_scale(0.5, 0.3, 0.5, 0.5) == 1.0
    assert progressive_scale(0.7, 0.3, 0.6, 0.6) == 1.0
    assert progressive_scale(0.59, 0.3, 0.6, 0.6) == 0.3


def test_known_pinned_scales():
    assert pin_scale(32, 0.5, 4) == 0.5  # 16 is a multiple of 4
    assert pin_scale(30, 0.5, 4) == 16 / 30  # 15 rounds to the multiple 16
    assert pin_scale(40, 0.3, 8) == 16 / 40  # 12 -> round(1.5) = 2 increments (banker's)
    assert pin_scale(40, 0.05, 8) == 8 / 40  # at least one increment
    assert pin_scale(6, 0.5, 8) == 1.0  # an increment wider than the image: the image's width


@pytest.mark.parametrize("seed", range(5))
def test_the_crop_corner_is_drawn_top_then_left_over_all_valid_offsets(seed):
    x = torch.rand(2, 1, 6, 9)
    crop, _ = resize_batch(x, None, 0.5, mode="crop", generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed)  # the documented draws: top in [0, 3), left in [0, 5)
    top = int(torch.randint(0, 6 - 3, (1,), generator=g))
    left = int(torch.randint(0, 9 - 4, (1,), generator=g))
    assert torch.equal(crop, x[..., top : top + 3, left : left + 4])
    # one valid top offset (0) is still a draw: the left offset is the second draw
    x = torch.rand(1, 1, 2, 9)
    crop, _ = resize_batch(x, None, 0.5, mode="crop", generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed)
    assert int(torch.randint(0, 1, (1,), generator=g)) == 0
    left = int(torch.randint(0, 9 - 4, (1,), generator=g))
    assert torch.equal(crop, x[..., 0:1, left : left + 4])


def test_crop_of_non_square_images_and_targets_at_another_resolution():
    x = torch.rand(2, 3, 8, 12)
    seg = torch.arange(16 * 24).view(1, 16, 24).expand(2, 16, 24)  # twice the images' size
    small, seg_small = resize_batch(x, seg, 0.25, "crop", True, crop_offset=(2, 3))
    assert torch.equal(small, x[..., 2:4, 3:6])  # 0.25 * (8, 12) = (2, 3)
    assert torch.equal(seg_small, seg[:, 4:8, 6:12])  # the same region: (4, 6) at (2, 3) * 2


def test_full_or_larger_scale_returns_the_batch_itself():
    x, y = torch.rand(2, 1, 4, 4), torch.tensor([0, 1])
    for scale in (1.0, 1.5):
        out, out_y = resize_batch(x, y, scale)
        assert out is x and out_y is y


@pytest.mark.parametrize("target", [torch.zeros(2, 8), [0, 1]], ids=["2d", "list"])
def test_resize_targets_refuses_targets_that_are_not_images(target):
    with pytest.raises(ValueError, match=r"image-shaped targets \(N, H, W\)"):
        resize_batch(torch.rand(2, 3, 8, 8), target, 0.5, resize_targets=True)


def test_crop_of_channel_free_images_and_float_targets_uses_their_last_two_dimensions():
    x = torch.rand(2, 8, 12)  # (N, H, W) grayscale without a channel dimension
    soft = torch.rand(2, 16, 24)  # a float (N, H, W) target (e.g. a soft mask), twice the size
    small, soft_small = resize_batch(x, soft, 0.25, "crop", True, crop_offset=(2, 3))
    assert torch.equal(small, x[:, 2:4, 3:6])
    assert torch.equal(soft_small, soft[:, 4:8, 6:12])
