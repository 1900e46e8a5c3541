"""RandAugment as a step transform (Composer's `RandAugment`).

Composer inserts RandAugment into the dataset's PIL pipeline; here it augments the image tensors of
each batch inside the step, every image independently, with draws from the step's key.
`value_range` tells where float images live (e.g. `(0, 1)`, or the bounds of normalized data);
uint8 images need none.

Order: a pure input transform; list it before MixUp/CutMix/CutOut.

Example:
    >>> step = functrain.compose(step, randaugment(severity=9, depth=2))
"""

from __future__ import annotations

from typing import Any

from ..functional.augmentation_primitives import check_severity, resolve_augmentation_set
from ..functional.randaugment import randaugment_batch
from ..step import Algorithm
from .batch_transform import image_batch_algorithm


def randaugment(
    severity: float = 9,
    depth: int = 2,
    augmentation_set: Any = "all",
    input_key: Any = 0,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> Algorithm:
    """Apply `depth` random augmentations to every training image.

    Args:
        severity: strength in [0, 10]. Default 9.
        depth: operations per image, >= 0 (0: identity). Default 2.
        augmentation_set: "all", "safe", "original" or a list of operations. Default "all".
        input_key: where the images sit in the batch.
        value_range: the value range of float images (values outside are clipped).
    Returns:
        the `Algorithm` "randaugment" (stateless, exactly resumable).
    """
    check_severity(severity, "RandAugment")
    if depth < 0:
        raise ValueError(f"RandAugment depth must be >= 0, got {depth}")
    resolve_augmentation_set(augmentation_set)  # fail at construction on a bad name

    def augment(images, generator):
        return randaugment_batch(
            images,
            severity,
            depth,
            augmentation_set,
            generator=generator,
            value_range=value_range,
        )

    return image_batch_algorithm("randaugment", input_key, augment)
