"""RandAugment (Cubuk et al., 2020): a random chain of `depth` augmentations per image.

Composer's semantics: each image independently gets `depth` operations, each chosen uniformly (with
replacement) from the augmentation set and applied at a strength drawn from the `severity` (see
`augmentation_primitives`). Images here are tensors, not PIL images, so the whole batch is
augmented inside the step: images that drew the same operation are processed together.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> randaugment_batch(torch.rand(4, 3, 8, 8), severity=9, depth=2, generator=g).shape
    torch.Size([4, 3, 8, 8])
"""

from __future__ import annotations

import torch

from .augmentation_chains import apply_random_chain, on_image_or_batch
from .augmentation_primitives import (
    check_severity,
    from_unit_range,
    resolve_augmentation_set,
    to_unit_range,
)
from .sampling import require_generator

__all__ = ["randaugment_batch", "randaugment_image"]


def randaugment_batch(
    images: torch.Tensor,
    severity: float = 9,
    depth: int = 2,
    augmentation_set="all",
    *,
    generator: torch.Generator | None = None,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """RandAugment every image of a batch independently.

    Args:
        images: `(N, C, H, W)`, uint8 or float spanning `value_range` (values outside are clipped).
        severity: strength in [0, 10]. Default 9.
        depth: operations per image. Default 2.
        augmentation_set: "all", "safe", "original", or a list of operations
            `op(images, level, generator)`.
        generator: the source of every random choice (required when `depth > 0`).
        value_range: the range of float images, e.g. `(-1, 1)` or the normalized data's bounds.
    Returns:
        augmented images of the same shape, dtype and value range.
    """
    check_severity(severity, "RandAugment")
    if depth < 0:
        raise ValueError(f"RandAugment depth must be >= 0, got {depth}")
    if images.dim() != 4:
        raise ValueError(
            f"randaugment_batch expects (N, C, H, W) images, got {tuple(images.shape)}"
        )
    ops = resolve_augmentation_set(augmentation_set)
    if depth == 0 or images.shape[0] == 0:
        return images
    generator = require_generator(generator, "RandAugment's operations")
    out = apply_random_chain(to_unit_range(images, value_range), ops, severity, generator, depth)
    return from_unit_range(out, value_range, images)


def randaugment_image(
    img: torch.Tensor,
    severity: float = 9,
    depth: int = 2,
    augmentation_set="all",
    *,
    generator: torch.Generator | None = None,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """RandAugment one image `(C, H, W)`, or each image of a batch `(N, C, H, W)` independently.

    Args: as `randaugment_batch`.
    Returns:
        the augmented image(s), same shape and dtype.
    """
    return on_image_or_batch(
        randaugment_batch,
        img,
        severity,
        depth,
        augmentation_set,
        generator=generator,
        value_range=value_range,
    )
