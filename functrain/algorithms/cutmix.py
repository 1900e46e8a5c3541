"""CutMix as a step transform (Composer's `CutMix`).

Per step, one permutation, one area `lambda ~ Beta(alpha, alpha)` and one box are drawn from the
step's key; `cutmix_batch` pastes the box of the permuted batch into every image, and the target
weight of the original is the exact unmixed fraction `area`: targets become
`area * targets + (1 - area) * targets[perm]` (dense, `interpolate_loss=False`), or the losses
are interpolated with those weights (`interpolate_loss=True`). Targets with the images' spatial
size (segmentation) get the box pasted instead. Metrics in `aux` use the original targets.

Order: as MixUp — after input transforms and `selective_backprop`; with `label_smoothing` and
`mixup` any order works.

Example:
    >>> step = functrain.compose(step, cutmix(alpha=1.0))
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.batch import get_item, set_item
from ..functional.cutmix import cutmix_batch, paste_box
from ..step import Algorithm
from .batch_transform import batch_algorithm, step_generator
from .mixed_targets import MixedTarget, mixing_weight


def cutmix(
    alpha: float = 1.0,
    interpolate_loss: bool = False,
    uniform_sampling: bool = False,
    input_key: Any = 0,
    target_key: Any = 1,
) -> Algorithm:
    """Train on images with a box pasted from another image, and correspondingly mixed targets.

    Args:
        alpha: Beta pseudocount for the box's area, >= 0. Default 1.
        interpolate_loss: interpolate the losses instead of the targets. Default False.
        uniform_sampling: every pixel equally likely to be in the box. Default False.
        input_key, target_key: where inputs and targets sit in the batch.
    Returns:
        the `Algorithm` "cutmix" (stateless, exactly resumable).
    """
    if alpha < 0:
        raise ValueError(f"cutmix alpha must be >= 0, got {alpha}")

    def transform(state, batch):
        inputs, targets = get_item(batch, input_key), get_item(batch, target_key)
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 4:
            raise TypeError(f"cutmix needs (N, C, H, W) image tensors at key {input_key!r}")
        mixed, permuted, area, bbox = cutmix_batch(
            inputs,
            targets,
            alpha=alpha,
            uniform_sampling=uniform_sampling,
            generator=step_generator(state, "cutmix"),
        )
        if area == 1:  # an empty box: nothing was mixed
            return batch
        per_pixel = (
            isinstance(targets, torch.Tensor)
            and targets.dim() > 2
            and targets.shape[-2:] == inputs.shape[-2:]
        )
        if per_pixel:
            target = paste_box(targets, permuted, bbox)
        else:
            weights = mixing_weight(area), mixing_weight(1 - area)
            target = MixedTarget(targets, permuted, *weights, interpolate_loss)
        return set_item(set_item(batch, input_key, mixed), target_key, target)

    return batch_algorithm("cutmix", transform, resolve_targets_at=target_key)
