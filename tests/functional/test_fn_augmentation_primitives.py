"""The RandAugment/AugMix operations on tensors: shape and range kept, PIL semantics, determinism."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional import augmentation_primitives as ap

ALL_OPS = sorted(
    {op for ops in ap.augmentation_sets.values() for op in ops}, key=lambda op: op.__name__
)


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.__name__)
@settings(max_examples=8, deadline=None)
@given(severity=st.floats(0.0, 10.0), channels=st.sampled_from([1, 3]), seed=st.integers(0, 10**6))
def test_every_operation_keeps_shape_and_range_and_is_pure_and_keyed(op, severity, channels, seed):
    images = torch.rand(3, channels, 7, 9, generator=torch.Generator().manual_seed(seed))
    before = images.clone()
    out = op(images, severity, torch.Generator().manual_seed(seed))
    assert out.shape == images.shape and out.dtype == images.dtype
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0 + 1e-6
    assert torch.equal(images, before)
    assert torch.equal(out, op(images, severity, torch.Generator().manual_seed(seed)))


def test_identity_affine_and_integer_translation_follow_pil_pixel_centres():
    x = torch.rand(2, 3, 5, 6)
    assert torch.allclose(ap.affine(x, ap._matrices(2)), x, atol=1e-6)
    shifted = ap.affine(x, ap._matrices(2, c=2.0))  # output (x, y) samples input (x + 2, y)
    assert torch.allclose(shifted[..., :4], x[..., 2:], atol=1e-6)
    assert shifted[..., 4:].abs().max() < 1e-5  # zero fill (up to float32 grid rounding)
    turned = ap.affine(x[:, :, :5, :5], ap._matrices(2, a=0.0, b=1.0, d=1.0, e=0.0))
    assert torch.allclose(turned, x[:, :, :5, :5].transpose(-1, -2), atol=1e-6)


def test_tone_operations_match_their_pil_definitions():
    levels = torch.arange(256, dtype=torch.float32).view(1, 1, 16, 16) / 255
    # autocontrast stretches each channel to the full range
    low = levels * 0.5 + 0.25
    out = ap.autocontrast(low)
    assert torch.isclose(out.min(), torch.tensor(0.0)) and torch.isclose(
        out.max(), torch.tensor(1.0)
    )
    # equalize of an already uniform histogram keeps every level; it is monotone in general
    assert torch.allclose(ap.equalize(levels), levels, atol=1 / 255 + 1e-6)
    skewed = levels**3
    eq = ap.equalize(skewed).flatten()
    order = torch.argsort(skewed.flatten())
    assert bool((eq[order][1:] >= eq[order][:-1]).all())
    # brightness/contrast/colour with factor 1 are the identity; grayscale ignores colour on 1 channel
    rgb = torch.rand(2, 3, 4, 4)
    one = torch.ones(2, dtype=torch.float64)
    assert torch.allclose(ap._brightness(rgb, one), rgb)
    assert torch.allclose(ap._contrast(rgb, one), rgb)
    assert torch.allclose(ap._color(rgb, one), rgb)
    assert torch.allclose(ap._color(rgb, 0 * one), ap._grayscale(rgb).expand_as(rgb))


def test_sets_and_value_ranges():
    assert len(ap.augmentation_sets["all"]) == 13 and len(ap.augmentation_sets["safe"]) == 9
    assert ap.resolve_augmentation_set("original")[-1] is ap.sharpness_original
    with pytest.raises(KeyError, match="augmentation_set"):
        ap.resolve_augmentation_set("most")
    x = torch.tensor([[-1.0, 0.0, 1.0]]).view(1, 1, 1, 3)
    unit = ap.to_unit_range(x, (-1.0, 1.0))
    assert torch.equal(unit.flatten(), torch.tensor([0.0, 0.5, 1.0]))
    assert torch.equal(ap.from_unit_range(unit, (-1.0, 1.0), x), x)
    u8 = torch.tensor([0, 128, 255], dtype=torch.uint8).view(1, 1, 1, 3)
    assert torch.equal(ap.from_unit_range(ap.to_unit_range(u8, (0, 1)), (0, 1), u8), u8)
    with pytest.raises(ValueError, match="severity"):
        ap.check_severity(11, "RandAugment")


# -- geometry against PIL itself ------------------------------------------------------------------

PIL = pytest.importorskip("PIL.Image")


def _pil(array, how):
    """Apply `how(PIL image)` to an (H, W, 3) uint8 array; the result as an array."""
    import numpy as np

    return np.asarray(how(PIL.fromarray(array)))


def _ours(array, matrices):
    images = torch.from_numpy(array.copy()).permute(2, 0, 1)[None].double() / 255
    out = ap.affine(images, torch.tensor([matrices], dtype=torch.float64))
    return (out[0].permute(1, 2, 0) * 255).numpy()


def _rotation_matrix(degrees, width, height):
    """PIL's `Image.rotate` matrix (output -> input, about the centre)."""
    theta = -math.radians(degrees)
    a, b, d, e = math.cos(theta), math.sin(theta), -math.sin(theta), math.cos(theta)
    cx, cy = width / 2.0, height / 2.0
    return [a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy]


@pytest.mark.parametrize("degrees", [-3, 3, 17, -29, 90])
def test_rotation_matches_pil_bilinear_including_the_outer_ring(degrees):
    import numpy as np

    array = np.random.default_rng(degrees % 7).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    expected = _pil(array, lambda im: im.rotate(degrees, resample=PIL.BILINEAR))
    got = _ours(array, _rotation_matrix(degrees, 11, 9))
    # PIL rounds its 8-bit arithmetic; within one level everywhere, the border included.
    assert np.abs(got - expected.astype(np.float64)).max() <= 1.0


@pytest.mark.parametrize("amount", [0.3, -0.17])
@pytest.mark.parametrize("horizontal", [True, False])
def test_shear_matches_pil_bilinear(amount, horizontal):
    import numpy as np

    array = np.random.default_rng(3).integers(0, 256, (10, 8, 3), dtype=np.uint8)
    matrix = (1, amount, 0, 0, 1, 0) if horizontal else (1, 0, 0, amount, 1, 0)
    expected = _pil(array, lambda im: im.transform(im.size, PIL.AFFINE, matrix, PIL.BILINEAR))
    assert np.abs(_ours(array, list(matrix)) - expected).max() <= 1.0


def test_a_constant_image_rotated_slightly_is_never_blended_with_black():
    import numpy as np

    array = np.full((32, 32, 3), 200, dtype=np.uint8)
    pil = _pil(array, lambda im: im.rotate(-3, resample=PIL.BILINEAR))
    ours = _ours(array, _rotation_matrix(-3, 32, 32))
    # PIL blanks a pixel whose sample point leaves the image and repeats the edge otherwise:
    # every pixel is 200 or 0, none in between (zero padding would blend 124 into the corners).
    assert set(np.unique(pil)) == {0, 200}
    assert (pil[0] == 200).mean() > 0.7  # most of the top row keeps its value
    assert np.array_equal(ours.round(), pil.astype(np.float64))
