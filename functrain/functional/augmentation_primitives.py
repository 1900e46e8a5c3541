"""Image augmentations for RandAugment and AugMix, on batches of image tensors.

These are the operations of Composer's `augmentation_primitives` (after the AugMix reference code),
rewritten for tensors so that they run on a batch, on any device, inside the step: images are
float `(N, C, H, W)` with values in `[0, 1]` (the RandAugment/AugMix transforms map other value
ranges and uint8 in and out). Each operation draws its own strength per image from `generator`:

    op(images, level, generator) -> images      level: the severity, in [0, 10]

Strengths follow Composer: `_sample_level(level)` is `U(0.1, level)`; integer parameters are
`int(sample * maxval / 10)`; geometric operations flip their sign with probability 1/2; the
enhancement operations ("all" set) draw their factor from a distribution symmetric around 1, and
the "_original" ones from `U(0.1, level) * 0.18 + 0.1`. Geometric operations follow PIL's affine
convention (output pixel centres mapped to input coordinates, PIL's bilinear: zero fill where
the sample point leaves the image, the edge repeated inside it), the colour ones
PIL's `ImageEnhance` blends with the result clipped to `[0, 1]`; posterize, solarize and equalize
work on the 256-level quantisation of the image, as PIL does on 8-bit images.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> out = rotate(torch.rand(2, 3, 8, 8), 9, g)
    >>> out.shape
    torch.Size([2, 3, 8, 8])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

AugmentationFn = Callable[[torch.Tensor, float, torch.Generator], torch.Tensor]


# -- strength sampling (Composer's helpers, drawn per image) ------------------------------------


def _uniform(low, high, n: int, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)


def _sample_level(level: float, n: int, generator: torch.Generator) -> torch.Tensor:
    return _uniform(0.1, level, n, generator)


def _int_parameter(level: torch.Tensor, maxval: float) -> torch.Tensor:
    return torch.trunc(level * maxval / 10)


def _float_parameter(level: torch.Tensor, maxval: float) -> torch.Tensor:
    return level * maxval / 10.0


def _random_sign(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    flip = torch.rand(values.shape[0], generator=generator, dtype=torch.float64) > 0.5
    return torch.where(flip, -values, values)


def _symmetric_sample(level: float, n: int, generator: torch.Generator) -> torch.Tensor:
    """Factors with median 1: `U(1, level)` or `U(1 - 0.09 * level, 1)` with probability 1/2."""
    upper = torch.rand(n, generator=generator, dtype=torch.float64) > 0.5
    high = _uniform(1.0, level, n, generator)
    low = _uniform(1.0 - 0.09 * level, 1.0, n, generator)
    return torch.where(upper, high, low)


def _per_image(values: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return values.to(device=images.device, dtype=images.dtype).view(-1, 1, 1, 1)


# -- shared image helpers -----------------------------------------------------------------------


def _quantize(images: torch.Tensor) -> torch.Tensor:
    """The 0..255 integer levels of `images` (as PIL sees an 8-bit image)."""
    return torch.round(images.clamp(0, 1) * 255).to(torch.int64)


def _dequantize(levels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return levels.to(like.dtype) / 255


def _grayscale(images: torch.Tensor) -> torch.Tensor:
    """`(N, 1, H, W)` luminance: ITU-R 601 weights for RGB (PIL's "L"), the channel mean otherwise."""
    if images.shape[1] == 3:
        weights = torch.tensor([0.299, 0.587, 0.114], dtype=images.dtype, device=images.device)
        return (images * weights.view(1, 3, 1, 1)).sum(1, keepdim=True)
    return images.mean(1, keepdim=True)


def _blend(degenerate: torch.Tensor, images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's `ImageEnhance`: `degenerate + factor * (image - degenerate)`, clipped to [0, 1]."""
    factor = _per_image(factor, images)
    return (degenerate * (1 - factor) + images * factor).clamp(0, 1)


def affine(images: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """Apply PIL-style affine maps: output pixel `(x, y)` samples input `(a x + b y + c, d x + e y + f)`.

    PIL's bilinear `Image.transform` exactly (`Geometry.c`): the sample point is taken at the
    output pixel's centre; a point outside the input image gives the fill value (0), and a point
    inside it interpolates its four neighbours with the edge pixels repeated, so an image's
    border ring is not blended with black (`grid_sample` with zero padding would be).
    On uint8 images the arithmetic is PIL's: float64 on the levels, blends `a + (b - a) * t`, the
    result truncated (PIL's C cast, not rounding), so every pixel equals PIL's.

    Args:
        images: `(N, C, H, W)`, float or uint8.
        matrices: `(N, 6)` rows `(a, b, c, d, e, f)` in pixel units (x = column, y = row).
    Returns:
        the transformed images, in `images`' dtype.
    """
    if images.dtype == torch.uint8:
        levels = affine(images.to(torch.float64), matrices)
        return levels.trunc().clamp(0, 255).to(torch.uint8)
    n, channels, height, width = images.shape
    m = matrices.to(device=images.device, dtype=torch.float64).view(n, 6, 1, 1)
    ys = torch.arange(height, device=images.device, dtype=torch.float64).view(1, height, 1) + 0.5
    xs = torch.arange(width, device=images.device, dtype=torch.float64).view(1, 1, width) + 0.5
    in_x = m[:, 0] * xs + m[:, 1] * ys + m[:, 2]
    in_y = m[:, 3] * xs + m[:, 4] * ys + m[:, 5]
    inside = (in_x >= 0) & (in_x < width) & (in_y >= 0) & (in_y < height)
    x, y = in_x - 0.5, in_y - 0.5  # from pixel-centre to pixel-index coordinates
    x0, y0 = torch.floor(x), torch.floor(y)
    dx, dy = ((x - x0).to(images.dtype).unsqueeze(1), (y - y0).to(images.dtype).unsqueeze(1))
    flat = images.reshape(n, channels, height * width)

    def tap(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        row = row.clamp(0, height - 1).to(torch.int64)
        col = col.clamp(0, width - 1).to(torch.int64)
        index = (row * width + col).view(n, 1, height * width).expand(n, channels, -1)
        return flat.gather(2, index).view(n, channels, height, width)

    def lerp(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return a + (b - a) * t  # PIL's form: on uint8 levels the truncation then agrees exactly

    top = lerp(tap(y0, x0), tap(y0, x0 + 1), dx)
    bottom = lerp(tap(y0 + 1, x0), tap(y0 + 1, x0 + 1), dx)
    out = lerp(top, bottom, dy)
    return torch.where(inside.unsqueeze(1), out, torch.zeros((), dtype=out.dtype))


def _matrices(n: int, a=1.0, b=0.0, c=0.0, d=0.0, e=1.0, f=0.0) -> torch.Tensor:
    cols = [torch.as_tensor(v, dtype=torch.float64).expand(n) for v in (a, b, c, d, e, f)]
    return torch.stack(cols, dim=1)


# -- the operations -----------------------------------------------------------------------------


def autocontrast(images: torch.Tensor, level: float = 0.0, generator=None) -> torch.Tensor:
    """Stretch each channel to span [0, 1] (PIL's `autocontrast`; `level` is unused)."""
    del level, generator
    lo = images.amin(dim=(-2, -1), keepdim=True)
    hi = images.amax(dim=(-2, -1), keepdim=True)
    span = hi - lo
    stretched = (images - lo) / torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(span > 0, stretched, images)


def equalize(images: torch.Tensor, level: float = 0.0, generator=None) -> torch.Tensor:
    """Histogram-equalize each channel with PIL's `equalize` look-up table (`level` is unused)."""
    del level, generator
    n, c, h, w = images.shape
    q = _quantize(images).view(n * c, h * w)
    hist = torch.zeros(n * c, 256, dtype=torch.int64, device=images.device)
    hist.scatter_add_(1, q, torch.ones_like(q))
    total = hist.sum(1)
    # The count in the last non-empty bin does not spread (PIL leaves it out of the step).
    last = 255 - torch.argmax((hist.flip(1) > 0).to(torch.int64), dim=1)
    last_count = hist.gather(1, last.view(-1, 1)).squeeze(1)
    step = (total - last_count) // 255
    before = torch.cumsum(hist, 1) - hist  # pixels strictly below each level
    safe = torch.where(step > 0, step, torch.ones_like(step)).view(-1, 1)
    lut = ((before + (safe // 2)) // safe).clamp(max=255)
    mapped = lut.gather(1, q)
    keep = ((hist > 0).sum(1) <= 1) | (step == 0)
    out = torch.where(keep.view(-1, 1), q, mapped)
    return _dequantize(out.view(n, c, h, w), images)


def posterize(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Keep the top `4 - int(U(0.1, level) * 4 / 10)` bits of each 8-bit level."""
    bits = 4 - _int_parameter(_sample_level(level, images.shape[0], generator), 4).to(torch.int64)
    drop = (8 - bits).clamp(0, 8)
    mask = (~((1 << drop) - 1)) & 0xFF
    return _dequantize(_quantize(images) & mask.to(images.device).view(-1, 1, 1, 1), images)


def rotation_matrix(degrees: float, width: int, height: int) -> list[float]:
    """PIL's `Image.rotate` map (output -> input) about the centre, built as PIL builds it: angle
    modulo 360, cosine and sine rounded to 15 decimals, so uint8 pixels are PIL's bit for bit.

    Example:
        >>> rotation_matrix(90, 4, 2)
        [0.0, -1.0, 3.0, 1.0, 0.0, -1.0]
    """
    theta = -math.radians(degrees % 360.0)
    cos, sin = round(math.cos(theta), 15), round(math.sin(theta), 15)
    a, b, d, e = cos, sin, -sin, cos
    cx, cy = width / 2.0, height / 2.0
    return [a, b, a * -cx + b * -cy + 0.0 + cx, d, e, d * -cx + e * -cy + 0.0 + cy]


def rotate(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Rotate about the centre by `int(U(0.1, level) * 3)` degrees, either direction (PIL's sense)."""
    n, _, height, width = images.shape
    degrees = _random_sign(_int_parameter(_sample_level(level, n, generator), 30), generator)
    rows = [rotation_matrix(float(deg), width, height) for deg in degrees.tolist()]
    return affine(images, torch.tensor(rows, dtype=torch.float64).view(n, 6))


def solarize(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Invert the levels at or above `256 - int(U(0.1, level) * 25.6)`."""
    threshold = 256 - _int_parameter(_sample_level(level, images.shape[0], generator), 256)
    threshold = _per_image(threshold, images)
    return torch.where(images * 255 >= threshold - 0.5, 1 - images, images)


def _shear(images, level, generator, horizontal: bool) -> torch.Tensor:
    n = images.shape[0]
    amount = _random_sign(_float_parameter(_sample_level(level, n, generator), 0.3), generator)
    m = _matrices(n, b=amount) if horizontal else _matrices(n, d=amount)
    return affine(images, m)


def shear_x(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Shear horizontally by up to 0.3 (input x = x + s * y)."""
    return _shear(images, level, generator, horizontal=True)


def shear_y(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Shear vertically by up to 0.3 (input y = s * x + y)."""
    return _shear(images, level, generator, horizontal=False)


def _translate(images, level, generator, horizontal: bool) -> torch.Tensor:
    n, _, height, width = images.shape
    size = width if horizontal else height
    pixels = _int_parameter(_sample_level(level, n, generator), size / 3)
    pixels = _random_sign(pixels, generator)
    m = _matrices(n, c=pixels) if horizontal else _matrices(n, f=pixels)
    return affine(images, m)


def translate_x(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Shift horizontally by up to a third of the width."""
    return _translate(images, level, generator, horizontal=True)


def translate_y(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Shift vertically by up to a third of the height."""
    return _translate(images, level, generator, horizontal=False)


def _color(images, factor):
    return _blend(_grayscale(images).expand_as(images), images, factor)


def _contrast(images, factor):
    mean = _grayscale(images).mean(dim=(1, 2, 3), keepdim=True)
    mean = torch.floor(mean * 255 + 0.5) / 255  # PIL rounds the mean to an 8-bit level
    return _blend(mean.expand_as(images), images, factor)


def _brightness(images, factor):
    return _blend(torch.zeros_like(images), images, factor)


def _sharpness(images, factor):
    # PIL's SMOOTH filter: 3x3 kernel of ones with 5 in the centre, / 13; border pixels kept.
    smooth = images.clone()
    if images.shape[-2] > 2 and images.shape[-1] > 2:
        h, w = images.shape[-2], images.shape[-1]
        # Nine shifted views summed: cheaper on small images than a (grouped) convolution.
        window_sum = sum(
            images[..., i : h - 2 + i, j : w - 2 + j] for i in range(3) for j in range(3)
        )
        smooth[..., 1:-1, 1:-1] = (window_sum + 4 * images[..., 1:-1, 1:-1]) / 13
    return _blend(smooth, images, factor)


def _original_factor(level, n, generator):
    return _float_parameter(_sample_level(level, n, generator), 1.8) + 0.1


def color(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Blend towards/away from grayscale by a factor symmetric around 1."""
    return _color(images, _symmetric_sample(level, images.shape[0], generator))


def color_original(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Colour enhancement with the AugMix reference code's factor `0.18 * U(0.1, level) + 0.1`."""
    return _color(images, _original_factor(level, images.shape[0], generator))


def contrast(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Blend towards/away from the mean gray level by a factor symmetric around 1."""
    return _contrast(images, _symmetric_sample(level, images.shape[0], generator))


def contrast_original(
    images: torch.Tensor, level: float, generator: torch.Generator
) -> torch.Tensor:
    """Contrast with the reference code's factor."""
    return _contrast(images, _original_factor(level, images.shape[0], generator))


def brightness(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Scale intensities by a factor symmetric around 1 (increases damped by 0.75, as Composer)."""
    factor = _symmetric_sample(level, images.shape[0], generator)
    return _brightness(images, torch.where(factor > 1, factor * 0.75, factor))


def brightness_original(
    images: torch.Tensor, level: float, generator: torch.Generator
) -> torch.Tensor:
    """Brightness with the reference code's factor."""
    return _brightness(images, _original_factor(level, images.shape[0], generator))


def sharpness(images: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """Blend towards/away from PIL's SMOOTH-filtered image by a factor symmetric around 1."""
    return _sharpness(images, _symmetric_sample(level, images.shape[0], generator))


def sharpness_original(
    images: torch.Tensor, level: float, generator: torch.Generator
) -> torch.Tensor:
    """Sharpness with the reference code's factor."""
    return _sharpness(images, _original_factor(level, images.shape[0], generator))


_GEOMETRIC_AND_TONE = [
    autocontrast,
    equalize,
    posterize,
    rotate,
    solarize,
    shear_x,
    shear_y,
    translate_x,
    translate_y,
]

augmentation_sets: dict[str, list[AugmentationFn]] = {
    "all": _GEOMETRIC_AND_TONE + [color, contrast, brightness, sharpness],
    # No operation that overlaps with the ImageNet-C / CIFAR-10-C corruptions.
    "safe": list(_GEOMETRIC_AND_TONE),
    "original": _GEOMETRIC_AND_TONE
    + [color_original, contrast_original, brightness_original, sharpness_original],
}


def resolve_augmentation_set(augmentation_set) -> list[AugmentationFn]:
    """A list of operations from a set name ("all", "safe", "original") or a list of operations."""
    if isinstance(augmentation_set, str):
        if augmentation_set not in augmentation_sets:
            raise KeyError(
                f"unknown augmentation_set {augmentation_set!r}; use one of "
                f"{sorted(augmentation_sets)} or a list of operations"
            )
        return augmentation_sets[augmentation_set]
    ops = list(augmentation_set)
    if not ops or not all(callable(op) for op in ops):
        raise TypeError("augmentation_set must be a set name or a non-empty list of callables")
    return ops


def check_severity(severity: float, name: str) -> None:
    """Severity must be in [0, 10], Composer's range."""
    if not 0 <= severity <= 10 or math.isnan(severity):
        raise ValueError(f"{name} severity must satisfy 0 <= severity <= 10, got {severity}")


def to_unit_range(images: torch.Tensor, value_range: tuple[float, float]) -> torch.Tensor:
    """Float images in [0, 1] from uint8 images or float images spanning `value_range`."""
    if images.dtype == torch.uint8:
        return images.float() / 255
    if not images.is_floating_point():
        raise TypeError(f"expected float or uint8 images, got dtype {images.dtype}")
    lo, hi = value_range
    if not hi > lo:
        raise ValueError(f"value_range must be (low, high) with high > low, got {value_range}")
    if (lo, hi) == (0.0, 1.0):
        return images.clamp(0, 1)
    return ((images - lo) / (hi - lo)).clamp(0, 1)


def from_unit_range(
    images: torch.Tensor, value_range: tuple[float, float], like: torch.Tensor
) -> torch.Tensor:
    """Inverse of `to_unit_range`: back to `like`'s dtype and value range."""
    if like.dtype == torch.uint8:
        return torch.round(images * 255).clamp(0, 255).to(torch.uint8)
    lo, hi = value_range
    if (lo, hi) == (0.0, 1.0):
        return images.to(like.dtype)
    return (images * (hi - lo) + lo).to(like.dtype)
