"""CutMix (Yun et al., 2019): paste a box of another example into each image.

Composer's semantics: one box and one permutation for the whole batch. The box's nominal area
fraction `1 - lambda` comes from `lambda ~ Beta(alpha, alpha)`; its centre is uniform over the
image (or, with `uniform_sampling`, over an extended range so that every pixel is equally likely to
be covered), and it is clipped at the borders. The target weight of the original example is the
exact fraction of pixels left unmixed, `area = 1 - box_pixels / (H * W)`.

A box is `(x1, y1, x2, y2)` with `x` indexing dimension -2 (rows) and `y` dimension -1 (columns),
exactly as Composer indexes `input[..., x1:x2, y1:y2]`, so an explicit box gives the same output.

Example:
    >>> x = torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 2, 2)
    >>> mixed, y_perm, area, box = cutmix_batch(
    ...     x, torch.tensor([0, 1]), bbox=(0, 0, 1, 2), indices=torch.tensor([1, 0]))
    >>> mixed[0, 0], area
    (tensor([[1., 1.],
            [0., 0.]]), 0.5)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..data import num_samples
from .batch import take
from .sampling import beta, randint, require_generator

BBox = tuple[int, int, int, int]


def sample_cutmix_lambda(alpha: float, generator: torch.Generator | None) -> float:
    """`lambda ~ Beta(alpha, alpha)` (0 when `alpha == 0`); the box covers about `1 - lambda`."""
    if alpha < 0:
        raise ValueError(f"cutmix alpha must be >= 0, got {alpha}")
    if alpha == 0:
        return 0.0
    return beta(alpha, require_generator(generator, "cutmix's area"))


def _box_around(cx: int, cy: int, cut_w: int, cut_h: int, W: int, H: int) -> BBox:
    """The box of half-sizes `cut // 2` around `(cx, cy)`, clipped to the image."""

    def clip(v: int, hi: int) -> int:
        return min(max(v, 0), hi)

    return (
        clip(cx - cut_w // 2, W),
        clip(cy - cut_h // 2, H),
        clip(cx + cut_w // 2, W),
        clip(cy + cut_h // 2, H),
    )


def _sample_center(size: int, cut: int, uniform_sampling: bool, generator) -> int:
    if uniform_sampling:
        return randint(-cut // 2, size + cut // 2, generator)
    return randint(0, size, generator)


def rand_bbox(
    W: int,
    H: int,
    cutmix_lambda: float,
    *,
    uniform_sampling: bool = False,
    generator: torch.Generator | None = None,
    cx: int | None = None,
    cy: int | None = None,
) -> BBox:
    """A box covering about `1 - cutmix_lambda` of a `W x H` grid, clipped at the borders.

    Following Composer (and the CutMix reference code), `W` is the size of dimension -2 and `H`
    of dimension -1; the box's sides are `int(W * sqrt(1 - lambda))` and `int(H * sqrt(1 - lambda))`.

    Args:
        W, H: the sizes of dimensions -2 and -1.
        cutmix_lambda: in `[0, 1]`.
        uniform_sampling: draw centres over an extended range so every pixel is equally likely
            to be covered.
        generator: the source of the centre draws (x first) that are not given.
        cx, cy: explicit centre coordinates.
    Returns:
        `(x1, y1, x2, y2)`.
    """
    cut_ratio = math.sqrt(1.0 - cutmix_lambda)
    cut_w, cut_h = int(W * cut_ratio), int(H * cut_ratio)
    if cx is None:
        cx = _sample_center(
            W, cut_w, uniform_sampling, require_generator(generator, "cutmix's box")
        )
    if cy is None:
        cy = _sample_center(
            H, cut_h, uniform_sampling, require_generator(generator, "cutmix's box")
        )
    return _box_around(cx, cy, cut_w, cut_h, W, H)


def box_area_fraction(input: torch.Tensor, bbox: BBox) -> float:
    """The fraction of `input`'s spatial area *outside* `bbox` (CutMix's target weight)."""
    x1, y1, x2, y2 = bbox
    return 1 - ((x2 - x1) * (y2 - y1) / (input.shape[-1] * input.shape[-2]))


def cutmix_batch(
    input: torch.Tensor,
    target: Any,
    length: float | None = None,
    alpha: float = 1.0,
    bbox: BBox | None = None,
    indices: torch.Tensor | None = None,
    uniform_sampling: bool = False,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, Any, float, BBox]:
    """Paste the same box of a permuted copy of the batch into every image.

    Args:
        input: `(N, C, H, W)` images.
        target: `(N, ...)` targets (or any pytree of them); only permuted here.
        length: if given, the box's sides are `int(length * size)` of each spatial dimension
            (Composer's documented meaning); exclusive with `bbox`.
        alpha: Beta pseudocount for the box's area when neither `length` nor `bbox` is given.
        bbox: an explicit `(x1, y1, x2, y2)` box (see the module docstring for the axes).
        indices: a permutation of `range(N)`; drawn from `generator` if None.
        uniform_sampling: sample box centres so that every pixel is equally likely to be mixed.
        generator: the source of the draws not given explicitly (indices, area, then centre).
    Returns:
        `(input_mixed, target_perm, area, bbox)`: the mixed images, `target[indices]`, the
        fraction of each image left unmixed (the original target's weight), and the box used.
    Raises:
        ValueError: when both `length` and `bbox` are given, or on malformed input.
    """
    if bbox is not None and length is not None:
        raise ValueError(f"pass length or bbox to cutmix_batch, not both; got {length} and {bbox}")
    if input.dim() != 4:
        raise ValueError(
            f"cutmix_batch expects (N, C, H, W) images, got shape {tuple(input.shape)}"
        )
    n = input.shape[0]
    if indices is None:
        indices = torch.randperm(n, generator=require_generator(generator, "cutmix's permutation"))
    if indices.shape != (n,):
        raise ValueError(
            f"indices must be a permutation of {n} samples, got shape {tuple(indices.shape)}"
        )
    if num_samples(target) != n:
        raise ValueError(f"input has {n} samples but target has {num_samples(target)}")
    size_w, size_h = input.shape[2], input.shape[3]
    if bbox is None:
        if length is None:
            bbox = rand_bbox(
                size_w,
                size_h,
                sample_cutmix_lambda(alpha, generator),
                uniform_sampling=uniform_sampling,
                generator=generator,
            )
        else:
            if not 0.0 <= length <= 1.0:
                raise ValueError(f"cutmix length must be in [0, 1], got {length}")
            cut_w, cut_h = int(length * size_w), int(length * size_h)
            gen = require_generator(generator, "cutmix's box")
            cx = _sample_center(size_w, cut_w, uniform_sampling, gen)
            cy = _sample_center(size_h, cut_h, uniform_sampling, gen)
            bbox = _box_around(cx, cy, cut_w, cut_h, size_w, size_h)
    x1, y1, x2, y2 = (int(v) for v in bbox)
    bbox = (x1, y1, x2, y2)
    indices = indices.to(input.device)
    mixed = input.clone()
    mixed[:, :, x1:x2, y1:y2] = input[indices, :, x1:x2, y1:y2]
    return mixed, take(target, indices), box_area_fraction(input, bbox), bbox


def paste_box(target: torch.Tensor, target_perm: torch.Tensor, bbox: BBox) -> torch.Tensor:
    """Dense per-pixel targets (segmentation) with the box taken from `target_perm`.

    CutMix moves pixels, so per-pixel targets move with them instead of being interpolated.
    """
    x1, y1, x2, y2 = bbox
    out = target.clone()
    out[..., x1:x2, y1:y2] = target_perm[..., x1:x2, y1:y2]
    return out
