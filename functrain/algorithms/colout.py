"""ColOut as a step transform (Composer's `ColOut`).

`batch=True` (Composer's default): per step, one set of rows and columns is dropped from every
image (and from image-shaped targets with `resize_target="auto"`). `batch=False` stands in for
Composer's per-sample dataset transform: each image drops its own random rows and columns (the same
counts, so the batch still stacks). Images shrink, so the step gets cheaper.

Order: list it before MixUp/CutMix (they mix the smaller images) and before progressive resizing
only if you want both shrinkings to compound.

Example:
    >>> step = functrain.compose(step, colout(p_row=0.15, p_col=0.15))
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.batch import get_item, set_item
from ..functional.colout import colout_batch, should_resize_target
from ..step import Algorithm
from .batch_transform import batch_algorithm, step_generator


def colout(
    p_row: float = 0.15,
    p_col: float = 0.15,
    batch: bool = True,
    resize_target: bool | str = "auto",
    input_key: Any = 0,
    target_key: Any = 1,
) -> Algorithm:
    """Drop a random fraction of the rows and columns of the images.

    Args:
        p_row, p_col: fractions of rows/columns dropped, in [0, 1]. Default 0.15.
        batch: one draw for the whole batch (True) or one per image (False).
        resize_target: also cut image-shaped targets: True, False or "auto".
        input_key, target_key: where inputs and targets sit in the batch.
    Returns:
        the `Algorithm` "colout" (stateless, exactly resumable).
    """
    for name, p in (("p_row", p_row), ("p_col", p_col)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    if resize_target not in (True, False, "auto"):
        raise ValueError(f"resize_target must be True, False or 'auto', got {resize_target!r}")
    per_batch = batch

    def transform(state, batch):
        images, targets = get_item(batch, input_key), get_item(batch, target_key)
        if not isinstance(images, torch.Tensor) or images.dim() < 3:
            raise TypeError(f"colout needs image tensors (N, C, H, W) at key {input_key!r}")
        resize = should_resize_target((images, targets), resize_target)
        generator = step_generator(state, "colout")
        if per_batch:
            sample = (images, targets) if resize else images
            result = colout_batch(sample, p_row, p_col, resize, generator=generator)
            new_images, new_targets = result if resize else (result, targets)
        else:
            pairs = [
                colout_batch(
                    (images[i], targets[i]) if resize else images[i],
                    p_row,
                    p_col,
                    resize,
                    generator=generator,
                )
                for i in range(images.shape[0])
            ]
            if resize:
                new_images = torch.stack([p[0] for p in pairs])
                new_targets = torch.stack([p[1] for p in pairs])
            else:
                new_images, new_targets = torch.stack(pairs), targets
        batch = set_item(batch, input_key, new_images)
        return set_item(batch, target_key, new_targets) if resize else batch

    return batch_algorithm("colout", transform)
