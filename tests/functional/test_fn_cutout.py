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
