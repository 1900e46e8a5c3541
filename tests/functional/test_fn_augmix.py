"""augmix_batch/_image: the output is a convex mix of the image and its chains; keyed and pure."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.augmix import augmix_batch, augmix_image


def _identity(images, level, generator):
    return images.clone()


def _black(images, level, generator):
    return torch.zeros_like(images)


@settings(max_examples=15, deadline=None)
@given(
    severity=st.floats(0, 10),
    depth=st.sampled_from([-1, 1, 2]),
    width=st.integers(1, 3),
    alpha=st.floats(0.1, 3.0),
    seed=st.integers(0, 10**6),
)
def test_augmix_is_keyed_pure_and_in_range(severity, depth, width, alpha, seed):
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    x0 = x.clone()
    out = augmix_batch(
        x, severity, depth, width, alpha, generator=torch.Generator().manual_seed(seed)
    )
    assert out.shape == x.shape and float(out.min()) >= 0 and float(out.max()) <= 1 + 1e-6
    again = augmix_batch(
        x, severity, depth, width, alpha, generator=torch.Generator().manual_seed(seed)
    )
    assert torch.equal(out, again) and torch.equal(x, x0)


def test_mixing_copies_of_the_image_returns_the_image_and_black_chains_darken_it():
    x = torch.rand(4, 3, 5, 5) + 0.1
    gen = torch.Generator().manual_seed(0)
    assert torch.allclose(
        augmix_batch(x.clamp(0, 1), augmentation_set=[_identity], generator=gen),
        x.clamp(0, 1),
        atol=1e-6,
    )
    dark = augmix_batch(x.clamp(0, 1), augmentation_set=[_black], generator=gen)
    # (1 - m) * x + m * 0 with m in (0, 1): a per-image scaling of x by 1 - m
    ratio = dark / x.clamp(0, 1)
    per_image = ratio.flatten(1)
    assert bool(((per_image.max(1).values - per_image.min(1).values) < 1e-5).all())
    assert bool(((per_image[:, 0] > 0) & (per_image[:, 0] < 1)).all())


def test_single_image_and_argument_errors():
    img = torch.rand(3, 6, 6)
    assert augmix_image(img, generator=torch.Generator().manual_seed(2)).shape == img.shape
    with pytest.raises(ValueError, match="width"):
        augmix_batch(torch.rand(1, 1, 4, 4), width=0)
    with pytest.raises(ValueError, match="alpha"):
        augmix_batch(torch.rand(1, 1, 4, 4), alpha=0.0)
    with pytest.raises(ValueError, match="generator="):
        augmix_batch(torch.rand(1, 1, 4, 4))
