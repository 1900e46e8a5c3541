"""Augmentation operations against known outputs at non-identity strengths.

The tone operations are compared with PIL itself (`ImageEnhance`, `ImageOps`) at factors other
than 1 (factor 1 is the identity, which a no-op also passes); the sampled operations (solarize,
posterize, the enhancers at full severity) with the PIL output for the parameter they drew.
"""

import numpy as np
import pytest
import torch

from functrain.functional import augmentation_primitives as ap

PIL = pytest.importorskip("PIL.Image")
from PIL import ImageEnhance, ImageOps  # noqa: E402

# PIL rounds its intermediate grayscale/smoothed images to 8 bits, we do not: up to ~1.25 levels
LEVEL_TOLERANCE = 1.5


def _array(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (9, 11, 3), dtype=np.uint8)


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.copy()).permute(2, 0, 1)[None].double() / 255


def _levels(images: torch.Tensor) -> np.ndarray:
    return (images[0].permute(1, 2, 0) * 255).numpy()


ENHANCERS = [
    (ap._brightness, ImageEnhance.Brightness),
    (ap._contrast, ImageEnhance.Contrast),
    (ap._color, ImageEnhance.Color),
    (ap._sharpness, ImageEnhance.Sharpness),
]


@pytest.mark.parametrize("ours, theirs", ENHANCERS, ids=lambda x: getattr(x, "__name__", ""))
@pytest.mark.parametrize("factor", [0.0, 0.3, 1.7, 3.0])
def test_enhancers_match_pil_at_non_identity_factors(ours, theirs, factor):
    array = _array()
    expected = np.asarray(theirs(PIL.fromarray(array)).enhance(factor)).astype(np.float64)
    got = _levels(ours(_tensor(array), torch.tensor([factor], dtype=torch.float64)))
    assert np.abs(got - expected).max() <= LEVEL_TOLERANCE
    # the factor matters: far from the unchanged image (except where clipping saturates it)
    assert np.abs(got - array).max() > 20


def test_brightness_and_contrast_by_hand():
    x = torch.tensor([0.0, 0.2, 0.4, 0.8], dtype=torch.float64).view(1, 1, 2, 2).expand(1, 3, 2, 2)
    half = torch.tensor([0.5], dtype=torch.float64)
    double = torch.tensor([2.0], dtype=torch.float64)
    torch.testing.assert_close(ap._brightness(x, half), x * 0.5)
    torch.testing.assert_close(ap._brightness(x, double), (x * 2).clamp(max=1))
    # gray mean 0.35 -> 8-bit level round(89.25) = 89; contrast 2 doubles the distance to it
    mean = 89 / 255
    torch.testing.assert_close(ap._contrast(x, double), (mean + 2 * (x - mean)).clamp(0, 1))
    # colour 0 of a pure red pixel is its luminance 0.299 in every channel
    red = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).view(1, 3, 1, 1)
    zero = torch.tensor([0.0], dtype=torch.float64)
    torch.testing.assert_close(ap._color(red, zero), torch.full((1, 3, 1, 1), 0.299).double())


def _all_levels() -> torch.Tensor:
    return (torch.arange(256, dtype=torch.float64) / 255).view(1, 1, 16, 16).expand(1, 3, 16, 16)


@pytest.mark.parametrize("seed", range(6))
def test_solarize_inverts_the_levels_from_its_threshold_as_pil_does(seed):
    images = _all_levels()
    out = ap.solarize(images, 10.0, torch.Generator().manual_seed(seed))
    levels = torch.round(out[0, 0].flatten() * 255).long()
    inverted = levels != torch.arange(256)
    assert bool(inverted.any()) and bool(inverted[255]) and int(levels[255]) == 0
    threshold = int(torch.nonzero(inverted)[0])  # 256 - int(U(0.1, 10) * 25.6): in [1, 254]
    assert 1 <= threshold <= 254
    array = np.ascontiguousarray(_levels(images).round().astype(np.uint8))
    expected = np.asarray(ImageOps.solarize(PIL.fromarray(array), threshold))
    np.testing.assert_array_equal(_levels(out).round().astype(np.uint8), expected)


@pytest.mark.parametrize("seed", range(6))
def test_posterize_keeps_the_top_bits_as_pil_does(seed):
    array = _array(seed)
    out = _levels(ap.posterize(_tensor(array), 10.0, torch.Generator().manual_seed(seed)))
    out = out.round().astype(np.uint8)
    # at severity 10 it keeps 1..4 bits; the result must be PIL's for one of them
    candidates = {b: np.asarray(ImageOps.posterize(PIL.fromarray(array), b)) for b in range(1, 5)}
    assert any(np.array_equal(out, c) for c in candidates.values())
    assert not np.array_equal(out, array)


def test_autocontrast_and_equalize_match_pil():
    array = (_array(3) // 2 + 40).astype(np.uint8)  # a narrow range, so stretching shows
    ours = _levels(ap.autocontrast(_tensor(array)))
    theirs = np.asarray(ImageOps.autocontrast(PIL.fromarray(array))).astype(np.float64)
    assert np.abs(ours - theirs).max() <= LEVEL_TOLERANCE
    ours = _levels(ap.equalize(_tensor(array)))
    theirs = np.asarray(ImageOps.equalize(PIL.fromarray(array))).astype(np.float64)
    assert np.abs(ours - theirs).max() <= LEVEL_TOLERANCE


@pytest.mark.parametrize(
    "op",
    [ap.brightness, ap.contrast, ap.color, ap.sharpness]
    + [ap.brightness_original, ap.contrast_original, ap.color_original, ap.sharpness_original],
    ids=lambda op: op.__name__,
)
def test_enhancement_ops_at_full_severity_change_the_image(op):
    images = _tensor(_array(5)).expand(4, 3, 9, 11).contiguous()
    out = op(images, 10.0, torch.Generator().manual_seed(0))
    changed = (out - images).abs().flatten(1).amax(1)
    assert bool((changed > 5 / 255).all()), changed  # every image of the batch, well past rounding


def test_brightness_op_scales_each_image_by_one_factor():
    images = _tensor(_array(7)).expand(4, 3, 9, 11).contiguous() * 0.1  # no clipping at up to 7.5x
    out = ap.brightness(images, 10.0, torch.Generator().manual_seed(1))
    ratio = out / images.clamp(min=1e-12)
    mask = images > 1e-6
    for r, m in zip(ratio, mask):
        factors = r[m]
        assert float(factors.max() - factors.min()) < 1e-9  # one factor per image
        assert abs(float(factors[0]) - 1) > 1e-3  # and not the identity
