"""AugMix as a step transform (Composer's `AugMix`).

Composer inserts AugMix into the dataset's PIL pipeline; here it augments the image tensors of each
batch inside the step, every image independently, with draws from the step's key. Like Composer's,
it is the augmentation alone: no Jensen-Shannon consistency loss (that would need two extra
augmented views and forward passes per example). `value_range` tells where float images live.

Order: a pure input transform; list it before MixUp/CutMix/CutOut.

Example:
    >>> step = functrain.compose(step, augmix(severity=3, width=3))
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.augmentation_primitives import check_severity, resolve_augmentation_set
from ..functional.augmix import augmix_batch
from ..functional.batch import get_item, set_item
from ..step import Algorithm
from .batch_transform import batch_algorithm, step_generator


def augmix(
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: Any = "all",
    input_key: Any = 0,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> Algorithm:
    """Replace every training image by its AugMix blend.

    Args:
        severity: strength in [0, 10]. Default 3.
        depth: operations per chain (-1: 1 to 3 at random). Default -1.
        width: number of chains, >= 1. Default 3.
        alpha: Dirichlet/Beta pseudocount, > 0. Default 1.
        augmentation_set: "all", "safe", "original" or a list of operations. Default "all".
        input_key: where the images sit in the batch.
        value_range: the value range of float images (values outside are clipped).
    Returns:
        the `Algorithm` "augmix" (stateless, exactly resumable).
    """
    check_severity(severity, "AugMix")
    if width < 1:
        raise ValueError(f"AugMix width must be >= 1, got {width}")
    if alpha <= 0:
        raise ValueError(f"AugMix alpha must be > 0, got {alpha}")
    resolve_augmentation_set(augmentation_set)

    def transform(state, batch):
        images = get_item(batch, input_key)
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise TypeError(f"augmix needs (N, C, H, W) image tensors at key {input_key!r}")
        mixed = augmix_batch(
            images,
            severity,
            depth,
            width,
            alpha,
            augmentation_set,
            generator=step_generator(state, "augmix"),
            value_range=value_range,
        )
        return set_item(batch, input_key, mixed)

    return batch_algorithm("augmix", transform)
