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

from ..functional.augmentation_primitives import check_severity, resolve_augmentation_set
from ..functional.augmix import augmix_batch
from ..step import Algorithm
from .batch_transform import image_batch_algorithm


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

    def augment(images, generator):
        return augmix_batch(
            images,
            severity,
            depth,
            width,
            alpha,
            augmentation_set,
            generator=generator,
            value_range=value_range,
        )

    return image_batch_algorithm("augmix", input_key, augment)
