"""CutOut (DeVries & Taylor, 2017): zero out square holes of the images.

Composer's semantics: the same `num_holes` squares are cut from every image of the batch; each
square has side `int(min(H, W) * length)` around a centre drawn uniformly over the image (or over
an extended range with `uniform_sampling`, so every pixel is equally likely to be masked) and is
clipped at the borders. Masked pixels are multiplied by zero.

Example:
    >>> cutout_batch(torch.ones(1, 1, 4, 4), length=0.5, centers=[(1, 1)])[0, 0]
    tensor([[0., 0., 1., 1.],
            [0., 0., 1., 1.],
            [1., 1., 1., 1.],
            [1., 1., 1., 1.]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .sampling import randint, require_generator


def cutout_mask(
    height: int,
    width: int,
    num_holes: int = 1,
    length: float = 0.5,
    uniform_sampling: bool = False,
    *,
    generator: torch.Generator | None = None,
    centers: Sequence[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """The `(height, width)` float mask of ones with `num_holes` zeroed squares.

    Args:
        height, width: the image size.
        num_holes: how many squares.
        length: each square's side as a fraction of `min(height, width)`.
        uniform_sampling: draw centres over `[-side // 2, size + side // 2)`.
        generator: the source of the centres (row, then column, per hole) when not given.
        centers: explicit `(row, col)` centres, one per hole.
    Returns:
        the mask.
    """
    if num_holes < 0:
        raise ValueError(f"num_holes must be >= 0, got {num_holes}")
    if not 0.0 <= length <= 1.0:
        raise ValueError(f"cutout length must be in [0, 1], got {length}")
    side = int(min(height, width) * length)
    if centers is None:
        gen = require_generator(generator, "cutout's hole positions") if num_holes else None
        centers = []
        for _ in range(num_holes):
            if uniform_sampling:
                row = randint(-side // 2, height + side // 2, gen)
                col = randint(-side // 2, width + side // 2, gen)
            else:
                row, col = randint(0, height, gen), randint(0, width, gen)
            centers.append((row, col))
    elif len(centers) != num_holes:
        raise ValueError(
            f"got {len(centers)} centres for num_holes={num_holes}; pass one (row, col) per hole"
        )
    mask = torch.ones(height, width)
    for row, col in centers:
        r1, r2 = min(max(row - side // 2, 0), height), min(max(row + side // 2, 0), height)
        c1, c2 = min(max(col - side // 2, 0), width), min(max(col + side // 2, 0), width)
        mask[r1:r2, c1:c2] = 0.0
    return mask


def cutout_batch(
    input: torch.Tensor,
    num_holes: int = 1,
    length: float = 0.5,
    uniform_sampling: bool = False,
    *,
    generator: torch.Generator | None = None,
    centers: Sequence[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """Images with the same square holes zeroed in every one.

    Args:
        input: an image `(C, H, W)` or a batch `(N, C, H, W)`.
        num_holes: how many squares. Default 1.
        length: each square's side as a fraction of `min(H, W)`. Default 0.5.
        uniform_sampling: every pixel equally likely to be masked (vs. the paper's centre draw).
        generator: the source of the hole centres when `centers` is not given.
        centers: explicit `(row, col)` centres, one per hole.
    Returns:
        `input * mask`, same shape and dtype.
    """
    if input.dim() < 2:
        raise ValueError(f"cutout_batch expects images (..., H, W), got shape {tuple(input.shape)}")
    mask = cutout_mask(
        input.shape[-2],
        input.shape[-1],
        num_holes,
        length,
        uniform_sampling,
        generator=generator,
        centers=centers,
    )
    return input * mask.to(device=input.device, dtype=input.dtype)
