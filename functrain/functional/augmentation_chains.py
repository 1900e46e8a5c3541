"""Random chains of augmentation operations, applied per image to a batch (RandAugment, AugMix).

Both methods apply a chain of operations drawn uniformly (with replacement) from an augmentation
set, independently for every image. On tensors the whole batch goes through each link of the
chain at once: images that drew the same operation are gathered, augmented together and scattered
back, so the cost is one call per operation in the set, not one per image.

Every random choice comes from the explicit `generator`, in a fixed order (per link: the choices,
then each operation's strengths in list order), so a chain is reproducible from its key.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> ops = augmentation_primitives.resolve_augmentation_set("safe")
    >>> apply_random_chain(torch.rand(4, 3, 8, 8), ops, 9, g, depths=2).shape
    torch.Size([4, 3, 8, 8])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .augmentation_primitives import AugmentationFn


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


def apply_random_chain(
    images: torch.Tensor,
    ops: Sequence[AugmentationFn],
    severity: float,
    generator: torch.Generator,
    depths: int | torch.Tensor,
) -> torch.Tensor:
    """Apply a chain of randomly chosen operations to every image of a batch.

    At each link every image draws one operation uniformly from `ops` (all images draw, even
    those whose own chain has ended, so the draws of one image do not depend on another's depth).

    Args:
        images: `(N, C, H, W)` in [0, 1].
        ops: the operations `op(images, level, generator)`.
        severity: their level, in [0, 10].
        generator: the source of the choices and of the operations' strengths.
        depths: the chain's length: an int for every image, or an `(N,)` integer tensor of
            per-image lengths (an image is left alone once its own length is reached).
    Returns:
        the augmented images (the input is not modified).
    Example:
        >>> apply_random_chain(x, ops, 3, g, depths=torch.tensor([1, 3]))  # doctest: +SKIP
    """
    n = images.shape[0]
    per_image = isinstance(depths, torch.Tensor)
    length = int(depths.max()) if isinstance(depths, torch.Tensor) else depths
    for link in range(length):
        choice = torch.randint(len(ops), (n,), generator=generator)
        active = depths > link if per_image else None
        images = apply_chain_step(images, choice, ops, severity, generator, active=active)
    return images


def on_image_or_batch(
    batch_fn: Callable[..., torch.Tensor], img: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """Run a batch augmentation on one image `(C, H, W)` (as a batch of one) or on a batch.

    Args:
        batch_fn: `batch_fn(images, *args, **kwargs)` on `(N, C, H, W)` images.
        img: `(C, H, W)` or `(N, C, H, W)`.
        *args, **kwargs: passed to `batch_fn`.
    Returns:
        `batch_fn`'s result, with the batch dimension removed again for a single image.
    Example:
        >>> on_image_or_batch(randaugment_batch, torch.rand(3, 8, 8), generator=g).shape
        torch.Size([3, 8, 8])
    """
    if img.dim() == 3:
        return batch_fn(img.unsqueeze(0), *args, **kwargs).squeeze(0)
    return batch_fn(img, *args, **kwargs)
