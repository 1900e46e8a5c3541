"""cutmix_batch: the label weight equals the unmixed area, box semantics, purity, determinism."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.cutmix import cutmix_batch, paste_box, rand_bbox


def _distinct_images(n, h, w):
    # Image i is constant i + 1, so every pixel tells which image it came from.
    return (torch.arange(n, dtype=torch.float32) + 1).view(n, 1, 1, 1).expand(n, 2, h, w).clone()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 6),
    h=st.integers(2, 12),
    w=st.integers(2, 12),
    alpha=st.floats(0.1, 4.0),
    uniform=st.booleans(),
    seed=st.integers(0, 10**6),
)
def test_label_weight_equals_the_fraction_of_original_pixels(n, h, w, alpha, uniform, seed):
    x = _distinct_images(n, h, w)
    x0 = x.clone()
    y = torch.arange(n)
    gen = torch.Generator().manual_seed(seed)
    mixed, y_perm, area, (x1, y1, x2, y2) = cutmix_batch(
        x, y, alpha=alpha, uniform_sampling=uniform, generator=gen
    )
    assert 0 <= x1 <= x2 <= h and 0 <= y1 <= y2 <= w
    perm = y_perm  # labels are 0..n-1, so the permuted labels are the permutation
    for i in range(n):
        own = (mixed[i] == i + 1).float().mean().item()
        if perm[i] != i:
            assert abs(own - area) < 1e-6  # CutMix's defining law
        box = mixed[i, :, x1:x2, y1:y2]
        assert bool((box == perm[i] + 1).all())  # the box comes from the paired image
    again = cutmix_batch(
        x, y, alpha=alpha, uniform_sampling=uniform, generator=torch.Generator().manual_seed(seed)
    )
    assert torch.equal(again[0], mixed) and again[2] == area  # deterministic under a key
    assert torch.equal(x, x0)  # pure


def test_explicit_box_matches_composer_indexing_and_empty_box_is_identity():
    x = torch.arange(2 * 1 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    perm = torch.tensor([1, 0])
    mixed, _, area, box = cutmix_batch(x, torch.tensor([0, 1]), bbox=(1, 0, 3, 2), indices=perm)
    expected = x.clone()
    expected[:, :, 1:3, 0:2] = x[perm, :, 1:3, 0:2]  # x indexes rows, y columns (as Composer)
    assert torch.equal(mixed, expected) and area == 1 - 4 / 12 and box == (1, 0, 3, 2)
    same, _, area, _ = cutmix_batch(x, torch.tensor([0, 1]), bbox=(1, 1, 1, 3), indices=perm)
    assert torch.equal(same, x) and area == 1.0


def test_length_gives_a_box_of_that_relative_side():
    x = torch.zeros(2, 1, 16, 16)
    for seed in range(5):
        _, _, area, (x1, y1, x2, y2) = cutmix_batch(
            x, torch.arange(2), length=0.5, generator=torch.Generator().manual_seed(seed)
        )
        assert x2 - x1 <= 8 and y2 - y1 <= 8  # clipped at the borders, never larger
    assert rand_bbox(16, 16, 0.75, cx=8, cy=8) == (4, 4, 12, 12)  # side 16 * sqrt(0.25)


def test_segmentation_targets_get_the_box_pasted():
    t = torch.zeros(2, 4, 4, dtype=torch.long)
    t[1] = 1
    out = paste_box(t, t[[1, 0]], (0, 0, 2, 2))
    assert out[0, :2, :2].eq(1).all() and out[0, 2:].eq(0).all() and t[0].eq(0).all()


def test_bad_arguments_are_explained():
    x = torch.zeros(2, 1, 4, 4)
    with pytest.raises(ValueError, match="not both"):
        cutmix_batch(x, torch.arange(2), length=0.5, bbox=(0, 0, 1, 1))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        cutmix_batch(torch.zeros(2, 4), torch.arange(2), bbox=(0, 0, 1, 1), indices=torch.arange(2))
    with pytest.raises(ValueError, match="generator="):
        cutmix_batch(x, torch.arange(2))


def test_the_box_area_follows_beta_alpha_alpha():
    # lambda ~ Beta(1, 1) is uniform on [0, 1]: mean 1/2 (a std of the mean of 400 draws is
    # 0.014); alpha 0 means no mixing weight at all: lambda 0, the box is the whole image.
    from functrain.functional.cutmix import sample_cutmix_lambda

    gen = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample_cutmix_lambda(1.0, gen) for _ in range(400)])
    assert 0.43 < draws.mean().item() < 0.57 and draws.min() >= 0 and draws.max() <= 1
    assert len(set(draws.tolist())) == 400
    assert sample_cutmix_lambda(0.0, gen) == 0.0


def test_a_length_box_on_a_non_square_image_spans_that_fraction_of_each_side():
    # 4 x 8 images, length 0.5: a box of (at most, when clipped) 2 rows by 4 columns.
    x, y, swap = _distinct_images(2, 4, 8), torch.tensor([0, 1]), torch.tensor([1, 0])
    sides = set()
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        mixed, _, area, (x1, y1, x2, y2) = cutmix_batch(
            x, y, length=0.5, indices=swap, generator=gen
        )
        rows, cols = x2 - x1, y2 - y1
        assert 0 <= rows <= 2 and 0 <= cols <= 4
        assert area == 1 - rows * cols / 32
        assert (mixed[0] != x[0]).sum().item() == 2 * rows * cols  # 2 channels, all pasted
        sides.add((rows, cols))
    assert (2, 4) in sides  # an unclipped box


def test_default_centres_are_inside_the_image_and_uniform_ones_reach_past_it():
    # A 6-side box (length 0.6 of 10) around centre c covers [c - 3, c + 3) clipped to [0, 10).
    # Default (Composer): c uniform in [0, 10), so at least 3 rows and columns stay inside.
    # uniform_sampling: c uniform in [-3, 13); fewer than 3 rows inside for c in {-3, -2, -1,
    # 11, 12}: 5 of 16 values, so 1 - (11/16)^2 = 0.53 of the boxes are that thin on an axis.
    x, y = _distinct_images(2, 10, 10), torch.tensor([0, 1])
    thin = {False: 0, True: 0}
    for uniform in (False, True):
        for seed in range(300):
            gen = torch.Generator().manual_seed(seed)
            options = {"uniform_sampling": True} if uniform else {}  # False: the default
            *_, (x1, y1, x2, y2) = cutmix_batch(x, y, length=0.6, generator=gen, **options)
            assert x2 - x1 <= 6 and y2 - y1 <= 6
            thin[uniform] += x2 - x1 < 3 or y2 - y1 < 3
    assert thin[False] == 0
    assert 0.42 < thin[True] / 300 < 0.64
