"""AugMix (Hendrycks et al., 2020): mix an image with a blend of randomly augmented copies.

Composer's semantics, per image: `width` chains of `depth` operations each (`depth=-1`: each chain
draws its depth uniformly from {1, 2, 3}) produce augmented copies; they are averaged with weights
`w ~ Dirichlet(alpha, ..., alpha)`, and the result is mixed with the original image with weight
`m ~ Beta(alpha, alpha)`:

    augmix(x) = (1 - m) * x + m * sum_i w_i * chain_i(x)

so the output stays in the convex hull of the original and its augmentations. Composer's version
rounds the result down to 8 bits (PIL images); on float tensors nothing is rounded. Composer's
AugMix has no Jensen-Shannon consistency loss, and neither has this one.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> augmix_batch(torch.rand(2, 3, 8, 8), generator=g).shape
    torch.Size([2, 3, 8, 8])
"""

from __future__ import annotations

import torch

from .augmentation_chains import apply_random_chain, on_image_or_batch
from .augmentation_primitives import (
    check_severity,
    from_unit_range,
    resolve_augmentation_set,
    to_unit_range,
)
from .sampling import numpy_rng, require_generator


def augmix_batch(
    images: torch.Tensor,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set="all",
    *,
    generator: torch.Generator | None = None,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """AugMix every image of a batch independently.

    Args:
        images: `(N, C, H, W)`, uint8 or float spanning `value_range` (values outside are clipped).
        severity: strength of the operations, in [0, 10]. Default 3.
        depth: operations per chain; -1 (any value <= 0, as in Composer) draws 1, 2 or 3 per
            chain and image. Default -1.
        width: number of chains. Default 3.
        alpha: pseudocount of the Dirichlet (chain weights) and Beta (mixing) draws, > 0.
        augmentation_set: "all", "safe", "original", or a list of operations.
        generator: the source of every random choice.
        value_range: the range of float images.
    Returns:
        the mixed images, same shape, dtype and value range.
    """
    check_severity(severity, "AugMix")
    if width < 1:
        raise ValueError(f"AugMix width must be >= 1, got {width}")
    if alpha <= 0:
        raise ValueError(f"AugMix alpha must be > 0, got {alpha}")
    if images.dim() != 4:
        raise ValueError(f"augmix_batch expects (N, C, H, W) images, got {tuple(images.shape)}")
    ops = resolve_augmentation_set(augmentation_set)
    n = images.shape[0]
    if n == 0:
        return images
    generator = require_generator(generator, "AugMix's operations and weights")
    x = to_unit_range(images, value_range)
    rng = numpy_rng(generator)
    chain_weights = torch.as_tensor(rng.dirichlet([alpha] * width, size=n), dtype=x.dtype)
    mixing = torch.as_tensor(rng.beta(alpha, alpha, size=n), dtype=x.dtype)
    chain_weights, mixing = chain_weights.to(x.device), mixing.to(x.device)
    combined = torch.zeros_like(x)
    for chain in range(width):
        if depth > 0:
            depths = torch.full((n,), depth)
        else:
            depths = torch.randint(1, 4, (n,), generator=generator)
        augmented = apply_random_chain(x, ops, severity, generator, depths)
        combined = combined + chain_weights[:, chain].view(-1, 1, 1, 1) * augmented
    m = mixing.view(-1, 1, 1, 1)
    mixed = (1 - m) * x + m * combined
    return from_unit_range(mixed, value_range, images)


def augmix_image(
    img: torch.Tensor,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set="all",
    *,
    generator: torch.Generator | None = None,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """AugMix one image `(C, H, W)`, or each image of a batch `(N, C, H, W)` independently.

    Args: as `augmix_batch`.
    Returns:
        the mixed image(s), same shape and dtype.
    """
    return on_image_or_batch(
        augmix_batch,
        img,
        severity,
        depth,
        width,
        alpha,
        augmentation_set,
        generator=generator,
        value_range=value_range,
    )
