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

from .augmentation_primitives import (
    check_severity,
    from_unit_range,
    resolve_augmentation_set,
    to_unit_range,
)
from .sampling import require_generator


def apply_chain_step(images, op_index, ops, severity, generator, active=None) -> torch.Tensor:
    """Apply operation `ops[op_index[i]]` to image `i` (only where `active[i]`), grouping by operation.

    Args:
        images: `(N, C, H, W)` in [0, 1].
        op_index: `(N,)` integer choices.
        ops: the operations.
        severity: their level.
        generator: the source of each operation's strengths (operations in list order).
        active: optional `(N,)` bool mask of the images to touch.
    Returns:
        the new images (the input is not modified).
    """
    out = images
    for k, op in enumerate(ops):
        chosen = op_index == k
        if active is not None:
            chosen = chosen & active
        rows = torch.nonzero(chosen).flatten()
        if rows.numel() == 0:
            continue
        rows = rows.to(images.device)
        out = out.index_copy(0, rows, op(out.index_select(0, rows), severity, generator))
    return out


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
    out = to_unit_range(images, value_range)
    for _ in range(depth):
        choice = torch.randint(len(ops), (images.shape[0],), generator=generator)
        out = apply_chain_step(out, choice, ops, severity, generator)
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
    if img.dim() == 3:
        out = randaugment_batch(
            img.unsqueeze(0),
            severity,
            depth,
            augmentation_set,
            generator=generator,
            value_range=value_range,
        )
        return out.squeeze(0)
    return randaugment_batch(
        img, severity, depth, augmentation_set, generator=generator, value_range=value_range
    )
