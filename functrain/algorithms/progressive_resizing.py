"""Progressive resizing as a step transform (Composer's `ProgressiveResizing`).

At each step the scale is `progressive_scale(elapsed)` of the run (from `state.timestamp`: the
fraction `batch / max_batches`, which `fit` sets), with the new width pinned to a multiple of
`size_increment`; the batch is shrunk by nearest-neighbour resizing or by one random crop (drawn
from the step's key). The model must accept the smaller inputs (global pooling, as CNNs usually
have).

Order: list it before MixUp/CutMix (they then mix the small images, which is cheaper).

Example:
    >>> step = functrain.compose(step, progressive_resizing(initial_scale=0.5))
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.batch import get_item, set_item
from ..functional.progressive_resizing import MODES, pin_scale, progressive_scale, resize_batch
from ..step import Algorithm
from .batch_transform import batch_algorithm, elapsed_duration, step_generator


def progressive_resizing(
    mode: str = "resize",
    initial_scale: float = 0.5,
    finetune_fraction: float = 0.2,
    delay_fraction: float = 0.5,
    size_increment: int = 4,
    resize_targets: bool = False,
    input_key: Any = 0,
    target_key: Any = 1,
) -> Algorithm:
    """Train on smaller images early in the run.

    Args:
        mode: "resize" (nearest neighbour) or "crop" (random crop). Default "resize".
        initial_scale: starting scale, in [0, 1]. Default 0.5.
        finetune_fraction: final fraction of the run at full size. Default 0.2.
        delay_fraction: initial fraction of the run at `initial_scale`. Default 0.5.
        size_increment: widths are multiples of this. Default 4.
        resize_targets: also resize image-shaped targets (segmentation). Default False.
        input_key, target_key: where inputs and targets sit in the batch.
    Returns:
        the `Algorithm` "progressive_resizing" (stateless, exactly resumable).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not 0 <= initial_scale <= 1:
        raise ValueError(f"initial_scale must be in [0, 1], got {initial_scale}")
    if not 0 <= finetune_fraction <= 1:
        raise ValueError(f"finetune_fraction must be in [0, 1], got {finetune_fraction}")
    if not 0 <= delay_fraction <= 1 or delay_fraction + finetune_fraction > 1:
        raise ValueError(
            "delay_fraction must be in [0, 1] and delay_fraction + finetune_fraction <= 1, got "
            f"{delay_fraction} + {finetune_fraction}"
        )
    if size_increment < 1:
        raise ValueError(f"size_increment must be >= 1, got {size_increment}")

    def transform(state, batch):
        images, targets = get_item(batch, input_key), get_item(batch, target_key)
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise TypeError(
                f"progressive_resizing needs (N, C, H, W) image tensors at key {input_key!r}"
            )
        elapsed = elapsed_duration(state, "progressive_resizing")
        scale = progressive_scale(elapsed, initial_scale, finetune_fraction, delay_fraction)
        scale = pin_scale(images.shape[-1], scale, size_increment)
        if scale >= 1:
            return batch
        generator = step_generator(state, "progressive_resizing") if mode == "crop" else None
        new_images, new_targets = resize_batch(
            images, targets, scale, mode, resize_targets, generator=generator
        )
        batch = set_item(batch, input_key, new_images)
        return set_item(batch, target_key, new_targets) if resize_targets else batch

    return batch_algorithm("progressive_resizing", transform)
