"""cutout_batch: the same square holes in every image, sized by length, identity at zero."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.cutout import cutout_batch, cutout_mask


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(2, 16),
    w=st.integers(2, 16),
    holes=st.integers(0, 3),
    length=st.floats(0.0, 1.0),
    uniform=st.booleans(),
    seed=st.integers(0, 10**6),
)
def test_holes_are_shared_bounded_and_deterministic(h, w, holes, length, uniform, seed):
    x = torch.rand(3, 2, h, w) + 0.5  # strictly positive, so zeros are the holes
    x0 = x.clone()
    out = cutout_batch(x, holes, length, uniform, generator=torch.Generator().manual_seed(seed))
    zeros = out == 0
    assert bool((zeros == zeros[:1, :1]).all())  # the same holes in every image and channel
    side = int(min(h, w) * length)
    assert zeros[0, 0].sum() <= holes * side * side  # each hole at most side x side
    assert torch.equal(out[~zeros], x[~zeros])  # the rest untouched
    again = cutout_batch(x, holes, length, uniform, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(out, again) and torch.equal(x, x0)


def test_zero_strength_is_the_identity_and_explicit_centres_place_the_hole():
    x = torch.rand(2, 1, 6, 6)
    assert torch.equal(cutout_batch(x, num_holes=0), x)
    assert torch.equal(cutout_batch(x, length=0.0, centers=[(3, 3)]), x)
    mask = cutout_mask(6, 6, 1, 0.5, centers=[(0, 5)])  # side 3 around (0, 5), clipped
    assert mask.eq(0).nonzero().tolist() == [[0, 4], [0, 5]]
    with pytest.raises(ValueError, match="one \\(row, col\\) per hole"):
        cutout_mask(6, 6, 2, 0.5, centers=[(1, 1)])
    with pytest.raises(ValueError, match="generator="):
        cutout_batch(x)


def _hand_mask(height, width, side, centers):
    """Pixel (i, j) is cut iff row - side // 2 <= i < row + side // 2 (and so for columns)."""
    mask = torch.ones(height, width)
    for i in range(height):
        for j in range(width):
            for row, col in centers:
                inside_rows = row - side // 2 <= i < row + side // 2
                inside_cols = col - side // 2 <= j < col + side // 2
                if inside_rows and inside_cols:
                    mask[i, j] = 0.0
    return mask


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    length=st.floats(0.0, 1.0),
    centers=st.lists(st.tuples(st.integers(-6, 14), st.integers(-6, 14)), max_size=3),
)
def test_explicit_centres_cut_exactly_the_hand_computed_squares(h, w, length, centers):
    # centres off the image (uniform sampling draws them) clip to the part that is inside
    side = int(min(h, w) * length)
    got = cutout_mask(h, w, len(centers), length, centers=centers)
    assert torch.equal(got, _hand_mask(h, w, side, centers))


def test_known_masks_at_the_corners_and_with_an_even_side():
    # side 4 around (3, 2) of a 6x7 image: rows 1..4, columns 0..3
    expected = torch.ones(6, 7)
    expected[1:5, 0:4] = 0
    assert torch.equal(cutout_mask(6, 7, 1, 4 / 6, centers=[(3, 2)]), expected)
    # side 2 around (0, 0): only the corner pixel; around (-1, 3): nothing (fully above)
    corner = torch.ones(4, 4)
    corner[0, 0] = 0
    assert torch.equal(cutout_mask(4, 4, 1, 0.5, centers=[(0, 0)]), corner)
    assert torch.equal(cutout_mask(4, 4, 1, 0.5, centers=[(-1, 3)]), torch.ones(4, 4))
    assert torch.equal(cutout_mask(4, 4, 1, 0.5, centers=[(3, -1)]), torch.ones(4, 4))


def _replayed_centres(seed, holes, low_row, high_row, low_col, high_col):
    """The documented draw order: row then column per hole, each one torch.randint."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(holes):
        row = int(torch.randint(low_row, high_row, (1,), generator=g))
        col = int(torch.randint(low_col, high_col, (1,), generator=g))
        out.append((row, col))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_default_draws_centres_over_the_image_row_then_column(seed):
    h, w, holes, length = 9, 13, 2, 0.5  # side 4
    centers = _replayed_centres(seed, holes, 0, h, 0, w)
    expected = _hand_mask(h, w, 4, centers)
    assert bool((expected == 0).any())
    got = cutout_mask(h, w, holes, length, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(got, expected)
    # the batch form with its defaults (1 hole, length 0.5, no uniform sampling)
    x = torch.rand(2, 3, h, w) + 0.5
    one = _hand_mask(h, w, 4, _replayed_centres(seed, 1, 0, h, 0, w))
    out = cutout_batch(x, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(out, x * one)


@pytest.mark.parametrize("seed", range(6))
def test_uniform_sampling_draws_centres_over_the_extended_range(seed):
    h, w, holes = 7, 10, 3
    side = int(min(h, w) * 0.6)  # 4: centres in [-2, h + 2) x [-2, w + 2)
    centers = _replayed_centres(seed, holes, -2, h + 2, -2, w + 2)
    g = torch.Generator().manual_seed(seed)
    got = cutout_mask(h, w, holes, 0.6, True, generator=g)
    assert torch.equal(got, _hand_mask(h, w, side, centers))


def test_a_single_non_square_image_is_cut_in_its_own_height_and_width():
    x = torch.rand(2, 5, 8) + 0.5  # (C, H, W)
    out = cutout_batch(x, length=0.4, centers=[(4, 1)])  # side 2: rows 3..4, columns 0..1
    expected = x.clone()
    expected[:, 3:5, 0:2] = 0
    assert torch.equal(out, expected)


def test_cutout_mask_defaults_to_one_hole_of_half_the_shorter_side():
    g = torch.Generator().manual_seed(5)
    expected = _hand_mask(8, 10, 4, _replayed_centres(5, 1, 0, 8, 0, 10))
    assert torch.equal(cutout_mask(8, 10, generator=g), expected)
    assert int((expected == 0).sum()) > 0


def test_many_explicit_centres_and_a_single_2d_image():
    # a count beyond Python's small-int cache: compared by value, not identity
    centers = [(0, 0)] * 300
    corner = torch.ones(4, 4)
    corner[0, 0] = 0
    assert torch.equal(cutout_mask(4, 4, 300, 0.5, centers=centers), corner)
    x = torch.arange(1.0, 17.0).view(4, 4)  # (H, W): no channel dimension
    expected = x.clone()
    expected[0:2, 2:4] = 0
    assert torch.equal(cutout_batch(x, centers=[(1, 3)]), expected)
    with pytest.raises(ValueError, match=r"images \(..., H, W\)"):
        cutout_batch(torch.ones(4), centers=[(1, 1)])
