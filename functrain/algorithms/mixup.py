"""MixUp as a step transform (Composer's `MixUp`).

Per step, one coefficient `mixing = min(z, 1 - z)`, `z ~ Beta(alpha, alpha)`, and one permutation
are drawn from the step's key; the inputs are mixed by `mixup_batch` and the targets become
`(1 - mixing) * targets + mixing * targets[perm]` (dense, `interpolate_loss=False`) or the two
losses are interpolated with the same weights (`interpolate_loss=True`, right for any loss that
is linear in its targets, such as cross-entropy, and usable with losses that accept only class
indices). Metrics in `aux` are computed against the original targets.

Order: list MixUp after the input transforms that should be mixed (CutOut, RandAugment, resizing)
and after `selective_backprop`; with `label_smoothing` and `cutmix` any order works.

Example:
    >>> step = functrain.compose(step, mixup(alpha=0.2))
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.batch import get_item, set_item
from ..functional.mixup import mixup_batch
from ..step import Algorithm
from .batch_transform import batch_algorithm, step_generator
from .mixed_targets import MixedTarget, mixing_weight


def mixup(
    alpha: float = 0.2, interpolate_loss: bool = False, input_key: Any = 0, target_key: Any = 1
) -> Algorithm:
    """Train on convex combinations of pairs of examples and of their targets.

    Args:
        alpha: Beta pseudocount, >= 0 (0: no mixing). Default 0.2.
        interpolate_loss: interpolate the losses instead of the targets. Default False.
        input_key, target_key: where inputs and targets sit in the batch.
    Returns:
        the `Algorithm` "mixup" (stateless, exactly resumable).
    """
    if alpha < 0:
        raise ValueError(f"mixup alpha must be >= 0, got {alpha}")

    def transform(state, batch):
        inputs, targets = get_item(batch, input_key), get_item(batch, target_key)
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(f"mixup needs a tensor of inputs at key {input_key!r}")
        mixed, permuted, mixing = mixup_batch(
            inputs, targets, alpha=alpha, generator=step_generator(state, "mixup")
        )
        if mixing == 0:
            return batch
        weights = mixing_weight(1 - mixing), mixing_weight(mixing)
        target = MixedTarget(targets, permuted, *weights, interpolate_loss)
        return set_item(set_item(batch, input_key, mixed), target_key, target)

    return batch_algorithm("mixup", transform, resolve_targets_at=target_key)
