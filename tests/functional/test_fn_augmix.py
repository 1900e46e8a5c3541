"""augmix_batch/_image: the output is a convex mix of the image and its chains; keyed and pure."""

import numpy as np
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


def _recording(calls):
    """An operation that draws nothing and records (level, the images it was given)."""

    def op(images, level, generator):
        calls.append((level, images.clone()))
        return images

    return op


@pytest.mark.parametrize("fn", [augmix_batch, augmix_image])
def test_the_defaults_are_three_chains_at_severity_3_on_unit_float_images(fn):
    calls = []
    x = torch.rand(2, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    out = fn(x, depth=1, augmentation_set=[_recording(calls)], generator=torch.Generator())
    assert [level for level, _ in calls] == [3, 3, 3]  # width 3, one link each, severity 3
    assert all(torch.equal(seen, x) for _, seen in calls)  # value range (0, 1): as given
    torch.testing.assert_close(out, x)  # a convex mix of copies of x is x


@pytest.mark.parametrize("depth", [None, 0, -3], ids=["default", "0", "-3"])
@pytest.mark.parametrize("fn", [augmix_batch, augmix_image])
@pytest.mark.parametrize("seed", range(2))
def test_the_default_depth_draws_1_2_or_3_links_per_chain_and_image(seed, fn, depth):
    n, calls = 12, []
    kwargs = {} if depth is None else {"depth": depth}  # every depth <= 0 draws, as -1 does
    out = fn(
        torch.rand(n, 1, 2, 2),
        augmentation_set=[_recording(calls)],
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
    assert out.shape == (n, 1, 2, 2)
    # replay the documented draws: the NumPy seed, then per chain the depths U{1, 2, 3} and per
    # link every image's choice of operation (one operation: always 0; it draws nothing)
    g = torch.Generator().manual_seed(seed)
    torch.randint(0, 2**62, (1,), generator=g)
    expected, all_depths = [], []
    for _ in range(3):
        depths = torch.randint(1, 4, (n,), generator=g)
        all_depths.append(depths)
        for link in range(int(depths.max())):
            torch.randint(1, (n,), generator=g)
            expected.append(int((depths > link).sum()))
    assert [seen.shape[0] for _, seen in calls] == expected
    assert set(torch.cat(all_depths).tolist()) == {1, 2, 3}


@pytest.mark.parametrize("fn", [augmix_batch, augmix_image])
@pytest.mark.parametrize("alpha", [0.5, None, 2.0], ids=["0.5", "default", "2.0"])
def test_inverted_chains_mix_with_the_replayed_beta_weight(alpha, fn):
    # every chain inverts (depth 1), so the Dirichlet weights sum to one copy of 1 - x and
    # augmix(x) = (1 - m) x + m (1 - x), m the Beta(alpha, alpha) draw after the Dirichlet's
    x = torch.rand(4, 3, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    kwargs = {} if alpha is None else {"alpha": alpha}
    alpha = 1.0 if alpha is None else alpha  # the documented default
    invert = [lambda im, lv, g: 1 - im]
    out = fn(x, 3, 1, augmentation_set=invert, generator=torch.Generator().manual_seed(7), **kwargs)
    g = torch.Generator().manual_seed(7)
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=g)))
    rng.dirichlet([alpha] * 3, size=4)
    m = torch.as_tensor(rng.beta(alpha, alpha, size=4), dtype=torch.float64).view(-1, 1, 1, 1)
    torch.testing.assert_close(out, (1 - m) * x + m * (1 - x))


def test_an_empty_batch_is_returned_without_a_generator():
    empty = torch.rand(0, 3, 4, 4)
    assert augmix_batch(empty) is empty
