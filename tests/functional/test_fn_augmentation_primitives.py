"""The RandAugment/AugMix operations on tensors: shape and range kept, PIL semantics, determinism."""

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
    """`affine` on the uint8 image, as an (H, W, 3) uint8 array."""
    images = torch.from_numpy(array.copy()).permute(2, 0, 1)[None]
    out = ap.affine(images, torch.tensor([matrices], dtype=torch.float64))
    assert out.dtype == torch.uint8
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("degrees", [-30, -29, -3, 3, 17, 30])
@pytest.mark.parametrize("seed", range(4))
def test_rotation_matches_pil_bilinear_on_every_pixel(degrees, seed):
    import numpy as np

    rng = np.random.default_rng(seed * 101 + degrees % 7)
    height, width = (int(v) for v in rng.integers(3, 40, 2))
    array = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    expected = _pil(array, lambda im: im.rotate(degrees, resample=PIL.BILINEAR))
    got = _ours(array, ap.rotation_matrix(degrees, width, height))
    # PIL truncates its bilinear result to an 8-bit level (a C cast); so does `affine` on uint8,
    # with PIL's arithmetic, so every pixel agrees, the border included (rounding would put
    # about half of them one level off).
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("amount", [0.3, -0.17, 0.123])
@pytest.mark.parametrize("horizontal", [True, False])
def test_shear_matches_pil_bilinear_on_every_pixel(amount, horizontal):
    import numpy as np

    array = np.random.default_rng(3).integers(0, 256, (10, 8, 3), dtype=np.uint8)
    matrix = (1, amount, 0, 0, 1, 0) if horizontal else (1, 0, 0, amount, 1, 0)
    expected = _pil(array, lambda im: im.transform(im.size, PIL.AFFINE, matrix, PIL.BILINEAR))
    np.testing.assert_array_equal(_ours(array, list(matrix)), expected)


def test_float_images_keep_the_exact_interpolation():
    import numpy as np

    # float images are not quantised; truncated, their levels are PIL's uint8 result
    array = np.random.default_rng(5).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    matrix = ap.rotation_matrix(17, 11, 9)
    images = torch.from_numpy(array.copy()).permute(2, 0, 1)[None].double()
    levels = ap.affine(images, torch.tensor([matrix], dtype=torch.float64))
    assert not torch.equal(levels, levels.round())
    np.testing.assert_array_equal(
        levels[0].permute(1, 2, 0).trunc().to(torch.uint8).numpy(), _ours(array, matrix)
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    matrix=st.tuples(
        *[st.floats(-1.5, 1.5)] * 2, st.floats(-4, 4), *[st.floats(-1.5, 1.5)] * 2, st.floats(-4, 4)
    ),  # fmt: skip
)
def test_uint8_affine_is_the_float_interpolation_truncated(seed, matrix):
    # Law: on uint8 images `affine` is PIL's cast of the exact interpolation on the levels
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (2, 3, 5, 7), generator=gen, dtype=torch.uint8)
    m = torch.tensor([matrix, matrix], dtype=torch.float64)
    levels = ap.affine(images.double(), m)
    assert levels.min() >= 0 and levels.max() <= 255
    assert torch.equal(ap.affine(images, m), levels.trunc().to(torch.uint8))


def test_a_constant_image_rotated_slightly_is_never_blended_with_black():
    import numpy as np

    array = np.full((32, 32, 3), 200, dtype=np.uint8)
    pil = _pil(array, lambda im: im.rotate(-3, resample=PIL.BILINEAR))
    ours = _ours(array, ap.rotation_matrix(-3, 32, 32))
    # PIL blanks a pixel whose sample point leaves the image and repeats the edge otherwise:
    # every pixel is 200 or 0, none in between (zero padding would blend 124 into the corners).
    assert set(np.unique(pil)) == {0, 200}
    assert (pil[0] == 200).mean() > 0.7  # most of the top row keeps its value
    assert np.array_equal(ours, pil)


# -- every sampled operation against PIL at the strength it drew ---------------------------------
#
# The strengths are replayed from the generator with Composer's formulas written out here
# (`U(0.1, level)`, integer parameters truncated, a sign flip with probability 1/2, factors from
# `U(1, level)` or `U(1 - 0.09 level, 1)`), then PIL applies that strength to each image.

from PIL import ImageEnhance, ImageOps  # noqa: E402

N_IMAGES, SEVERITY = 6, 8.5


def _batch(seed=0):
    import numpy as np

    arrays = np.random.default_rng(seed).integers(0, 256, (N_IMAGES, 15, 18, 3), dtype=np.uint8)
    images = torch.from_numpy(arrays.copy()).permute(0, 3, 1, 2).double() / 255
    return arrays, images


def _as_arrays(images):
    return (images.permute(0, 2, 3, 1) * 255).numpy()


def g_for(seed):
    return torch.Generator().manual_seed(seed)


def _rand(g):
    return torch.rand(N_IMAGES, generator=g, dtype=torch.float64)


def _level(g):
    return 0.1 + (SEVERITY - 0.1) * _rand(g)


def _sign(g):
    return torch.where(_rand(g) > 0.5, -1.0, 1.0).double()


def _symmetric(g):
    upper = _rand(g) > 0.5
    high = 1.0 + (SEVERITY - 1.0) * _rand(g)
    low = (1.0 - 0.09 * SEVERITY) + 0.09 * SEVERITY * _rand(g)
    return torch.where(upper, high, low)


def _geometric_expectations(op, g, width, height):
    """Per image, the PIL call of Composer's operation at the strength `op` draws, and that strength."""
    s = _level(g)
    if op is ap.rotate:
        degrees = torch.trunc(s * 30 / 10) * _sign(g)
        calls = [lambda im, d=float(d): im.rotate(d, resample=PIL.BILINEAR) for d in degrees]
        return calls, degrees
    if op in (ap.shear_x, ap.shear_y):
        amount = s * 0.3 / 10 * _sign(g)
        make = (
            (lambda a: (1, a, 0, 0, 1, 0)) if op is ap.shear_x else (lambda a: (1, 0, 0, a, 1, 0))
        )
    else:
        size = width if op is ap.translate_x else height
        amount = torch.trunc(s * (size / 3) / 10) * _sign(g)
        if op is ap.translate_x:
            make = lambda p: (1, 0, p, 0, 1, 0)  # noqa: E731
        else:
            make = lambda p: (1, 0, 0, 0, 1, p)  # noqa: E731
    calls = [
        lambda im, m=make(float(a)): im.transform(im.size, PIL.AFFINE, m, PIL.BILINEAR)
        for a in amount
    ]
    return calls, amount


@pytest.mark.parametrize(
    "op",
    [ap.rotate, ap.shear_x, ap.shear_y, ap.translate_x, ap.translate_y],
    ids=lambda o: o.__name__,
)
@pytest.mark.parametrize("seed", [0, 1])
def test_geometric_ops_match_pil_at_the_drawn_strength(op, seed):
    import numpy as np

    arrays, images = _batch(seed)
    out = _as_arrays(op(images, SEVERITY, torch.Generator().manual_seed(seed)))
    calls, strengths = _geometric_expectations(op, torch.Generator().manual_seed(seed), 18, 15)
    levels = op(torch.from_numpy(arrays.copy()).permute(0, 3, 1, 2), SEVERITY, g_for(seed))
    assert levels.dtype == torch.uint8
    for got, got_u8, array, call in zip(
        out, levels.permute(0, 2, 3, 1), arrays, calls, strict=True
    ):
        expected = np.asarray(call(PIL.fromarray(array)))
        # float images: the exact interpolation (PIL truncates it); uint8: PIL's pixels exactly
        assert (got - expected >= -1e-9).all() and (got - expected < 1.0).all()
        np.testing.assert_array_equal(got_u8.numpy(), expected)
    # not the identity: every image that drew a non-zero strength moved (an integer strength
    # can truncate to 0), and at least two did
    moved = [bool(np.abs(got - a).max() > 20) for got, a in zip(out, arrays)]
    assert moved == (strengths != 0).tolist() and sum(moved) >= 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_posterize_and_solarize_match_pil_at_the_drawn_strength(seed):
    import numpy as np

    arrays, images = _batch(seed)
    g = torch.Generator().manual_seed(seed)
    bits = 4 - torch.trunc(_level(g) * 4 / 10)
    out = _as_arrays(ap.posterize(images, SEVERITY, torch.Generator().manual_seed(seed)))
    for got, array, b in zip(out, arrays, bits, strict=True):
        expected = np.asarray(ImageOps.posterize(PIL.fromarray(array), int(b)))
        np.testing.assert_array_equal(got.round().astype(np.uint8), expected)
    g = torch.Generator().manual_seed(seed)
    thresholds = 256 - torch.trunc(_level(g) * 256 / 10)
    assert bool((thresholds < 256).all())  # every image inverts some levels
    out = _as_arrays(ap.solarize(images, SEVERITY, torch.Generator().manual_seed(seed)))
    for got, array, t in zip(out, arrays, thresholds, strict=True):
        expected = np.asarray(ImageOps.solarize(PIL.fromarray(array), int(t)))
        np.testing.assert_array_equal(got.round().astype(np.uint8), expected)


ENHANCE_OPS = [
    (ap.color, ImageEnhance.Color, "symmetric"),
    (ap.contrast, ImageEnhance.Contrast, "symmetric"),
    (ap.brightness, ImageEnhance.Brightness, "symmetric"),
    (ap.sharpness, ImageEnhance.Sharpness, "symmetric"),
    (ap.color_original, ImageEnhance.Color, "original"),
    (ap.contrast_original, ImageEnhance.Contrast, "original"),
    (ap.brightness_original, ImageEnhance.Brightness, "original"),
    (ap.sharpness_original, ImageEnhance.Sharpness, "original"),
]


@pytest.mark.parametrize(
    "op, enhancer, kind", ENHANCE_OPS, ids=lambda x: getattr(x, "__name__", "")
)
@pytest.mark.parametrize("seed", [0, 1])
def test_enhance_ops_match_pil_at_the_drawn_factor(op, enhancer, kind, seed):
    import numpy as np

    arrays, images = _batch(seed)
    g = torch.Generator().manual_seed(seed)
    factors = _symmetric(g) if kind == "symmetric" else _level(g) * 1.8 / 10 + 0.1
    if op is ap.brightness:  # Composer damps brightening: factor * 0.75 above 1
        factors = torch.where(factors > 1, factors * 0.75, factors)
    assert bool(((factors - 1).abs() > 1e-3).all())  # no image drew the identity
    out = _as_arrays(op(images, SEVERITY, torch.Generator().manual_seed(seed)))
    for got, array, f in zip(out, arrays, factors, strict=True):
        expected = np.asarray(enhancer(PIL.fromarray(array)).enhance(float(f)))
        # PIL rounds its gray/smoothed image to 8 bits (error <= 0.5) before blending, so its
        # error grows with the factor's distance from 1, plus 0.5 for the final rounding
        tolerance = 0.5 * abs(float(f) - 1) + 1.0
        assert np.abs(got - expected.astype(np.float64)).max() <= tolerance


def test_solarize_counts_a_value_halfway_to_the_threshold_as_the_threshold_level():
    # level 0.1 draws exactly U(0.1, 0.1) = 0.1: threshold 256 - int(2.56) = 254. A float pixel
    # halfway between levels 253 and 254 rounds (half up) to 254 and is inverted; just below is not
    x = torch.tensor([253.5 / 255, 253.5 / 255 - 1e-9, 254 / 255, 200 / 255], dtype=torch.float64)
    assert float(x[0] * 255) == 253.5  # the premise: exactly halfway in float64
    out = ap.solarize(x.view(4, 1, 1, 1), 0.1, torch.Generator().manual_seed(0)).flatten()
    torch.testing.assert_close(out, torch.stack([1 - x[0], x[1], 1 - x[2], x[3]]))


def test_the_unit_range_is_clipped_and_otherwise_kept():
    x = torch.tensor([-0.5, 0.0, 0.25, 0.75, 1.0, 1.5]).view(1, 1, 2, 3)
    expected = torch.tensor([0.0, 0.0, 0.25, 0.75, 1.0, 1.0]).view(1, 1, 2, 3)
    assert torch.equal(ap.to_unit_range(x, (0.0, 1.0)), expected)
    assert torch.equal(ap.to_unit_range(x * 2 - 1, (-1.0, 1.0)), expected)


def test_equalize_known_pairs_and_pil_on_images_large_enough_to_change():
    import numpy as np

    # two levels, 450 pixels each: PIL's step is 450 // 255 = 1, so level 10 maps to the count
    # below it (0) and level 200 to 450, clipped to 255: the image becomes black and white
    two = torch.full((1, 1, 30, 30), 10 / 255, dtype=torch.float64)
    two[..., 15:, :] = 200 / 255
    out = torch.round(ap.equalize(two) * 255)
    assert torch.equal(out[..., :15, :], torch.zeros(1, 1, 15, 30, dtype=torch.float64))
    assert torch.equal(out[..., 15:, :], torch.full((1, 1, 15, 30), 255.0, dtype=torch.float64))
    # fewer than 256 pixels below the last level: PIL's step is 0 and nothing changes
    small = two[..., 10:20, :20]
    assert torch.equal(ap.equalize(small), small)
    # a random 24x24 image (576 pixels per channel, step 2) matches PIL exactly
    array = np.random.default_rng(4).integers(30, 160, (24, 24, 3), dtype=np.uint8)
    expected = np.asarray(ImageOps.equalize(PIL.fromarray(array)))
    images = torch.from_numpy(array.copy()).permute(2, 0, 1)[None].double() / 255
    got = (ap.equalize(images)[0].permute(1, 2, 0) * 255).round().numpy().astype(np.uint8)
    np.testing.assert_array_equal(got, expected)
    assert np.abs(got.astype(int) - array).max() > 50  # equalized, not the identity


def test_equalize_by_hand_with_one_crowded_level_and_a_step_of_exactly_one():
    import numpy as np

    # levels 0..255 once each plus 44 more zeros (15 x 20 pixels): step (300 - 1) // 255 = 1, so
    # level k > 0 maps to the 45 + (k - 1) pixels below it, clipped at 255; 0 stays 0
    first = torch.cat([torch.arange(256), torch.zeros(44, dtype=torch.long)])
    crowded = (first.double() / 255).view(1, 1, 15, 20)
    expected = torch.where(first > 0, (44 + first).clamp(max=255), 0).double()
    got = torch.round(ap.equalize(crowded) * 255).flatten()
    assert torch.equal(got, expected)
    # 100 zeros, 155 at 128, one 255 (16 x 16): step exactly 255 // 255 = 1, 128 -> 100
    levels = torch.cat([torch.zeros(100), torch.full((155,), 128.0), torch.tensor([255.0])])
    got = torch.round(ap.equalize((levels.double() / 255).view(1, 1, 16, 16)) * 255).flatten()
    assert torch.equal(got, torch.where(levels == 128, 100.0, levels).double())
    for values, shape in ((first, (15, 20)), (levels, (16, 16))):  # and PIL agrees
        array = values.to(torch.uint8).view(*shape, 1).expand(*shape, 3).numpy().copy()
        images = torch.from_numpy(array).permute(2, 0, 1)[None].double() / 255
        ours = (ap.equalize(images)[0].permute(1, 2, 0) * 255).round().numpy().astype(np.uint8)
        np.testing.assert_array_equal(ours, np.asarray(ImageOps.equalize(PIL.fromarray(array))))
