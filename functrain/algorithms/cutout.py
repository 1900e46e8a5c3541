"""CutOut as a step transform (Composer's `CutOut`).

Per step, `num_holes` square holes are drawn from the step's key and zeroed in every image of the
batch (the same holes for the whole batch, as Composer does).

Order: a pure input transform; list it before MixUp/CutMix so that the mixed images carry the holes.

Example:
    >>> step = functrain.compose(step, cutout(num_holes=1, length=0.5))
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.batch import get_item, set_item
from ..functional.cutout import cutout_batch
from ..step import Algorithm
from .batch_transform import batch_algorithm, step_generator


def cutout(
    num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False, input_key: Any = 0
) -> Algorithm:
    """Zero out square holes of the input images.

    Args:
        num_holes: holes per batch. Default 1.
        length: each hole's side as a fraction of `min(H, W)`, in [0, 1]. Default 0.5.
        uniform_sampling: every pixel equally likely to be masked. Default False.
        input_key: where the images sit in the batch.
    Returns:
        the `Algorithm` "cutout" (stateless, exactly resumable).
    """
    if num_holes < 0:
        raise ValueError(f"num_holes must be >= 0, got {num_holes}")
    if not 0.0 <= length <= 1.0:
        raise ValueError(f"cutout length must be in [0, 1], got {length}")

    def transform(state, batch):
        images = get_item(batch, input_key)
        if not isinstance(images, torch.Tensor) or images.dim() < 3:
            raise TypeError(f"cutout needs image tensors (N, C, H, W) at key {input_key!r}")
        holed = cutout_batch(
            images, num_holes, length, uniform_sampling, generator=step_generator(state, "cutout")
        )
        return set_item(batch, input_key, holed)

    return batch_algorithm("cutout", transform)
