"""ColOut: drop a random fraction of the rows and columns of images (and of dense targets).

Composer's semantics: keep `int((1 - p_row) * H)` rows and `int((1 - p_col) * W)` columns, chosen
uniformly without replacement and kept in their original order, the same ones for every image in
the call. A target image of the same spatial size (segmentation) loses the same rows and columns
(`resize_target="auto"`). The images shrink, so each step is cheaper.

Example:
    >>> x = torch.arange(16.0).view(1, 1, 4, 4)
    >>> colout_batch(x, kept_rows=[0, 3], kept_cols=[1, 2])[0, 0]
    tensor([[ 1.,  2.],
            [13., 14.]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .sampling import require_generator


def _keep(size: int, fraction_dropped: float, generator, what: str) -> torch.Tensor:
    kept = int((1 - fraction_dropped) * size)
    gen = require_generator(generator, f"colout's {what}")
    return torch.sort(torch.randperm(size, generator=gen)[:kept]).values


def should_resize_target(sample: Any, resize_target: bool | str) -> bool:
    """Whether the second item of `sample` is also cut (`"auto"`: when it is an image-sized tensor)."""
    if isinstance(resize_target, bool):
        return resize_target
    if resize_target != "auto":
        raise ValueError(f"resize_target must be True, False or 'auto', got {resize_target!r}")
    if not isinstance(sample, (tuple, list)) or len(sample) < 2:
        return False
    input, target = sample[0], sample[1]
    return (
        isinstance(target, torch.Tensor)
        and target.dim() > 2
        and target.shape[-2:] == input.shape[-2:]
    )


def colout_batch(
    sample: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    p_row: float = 0.15,
    p_col: float = 0.15,
    resize_target: bool | str = "auto",
    *,
    generator: torch.Generator | None = None,
    kept_rows: Sequence[int] | torch.Tensor | None = None,
    kept_cols: Sequence[int] | torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Images (and optionally target images) with the same random rows and columns dropped.

    Args:
        sample: images `(..., H, W)`, or an `(images, targets)` pair.
        p_row: fraction of rows to drop, in `[0, 1]`. Default 0.15.
        p_col: fraction of columns to drop, in `[0, 1]`. Default 0.15.
        resize_target: for a pair, also cut the targets (True/False), or "auto" (when they have
            the images' spatial size).
        generator: the source of the rows (drawn first) and columns not given explicitly.
        kept_rows, kept_cols: explicit sorted indices to keep.
    Returns:
        the smaller images, or the `(images, targets)` pair (targets cut or unchanged).
    """
    for name, p in (("p_row", p_row), ("p_col", p_col)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    is_pair = isinstance(sample, (tuple, list))
    if is_pair and len(sample) != 2:
        raise ValueError(
            f"sample must be images or an (images, targets) pair, got {len(sample)} items"
        )
    input = sample[0] if is_pair else sample
    if input.dim() < 2:
        raise ValueError(f"colout_batch expects images (..., H, W), got shape {tuple(input.shape)}")
    rows = _keep(input.shape[-2], p_row, generator, "rows") if kept_rows is None else kept_rows
    cols = _keep(input.shape[-1], p_col, generator, "columns") if kept_cols is None else kept_cols
    rows = torch.as_tensor(rows, dtype=torch.long, device=input.device)
    cols = torch.as_tensor(cols, dtype=torch.long, device=input.device)

    def cut(x: torch.Tensor) -> torch.Tensor:
        return x.index_select(-2, rows.to(x.device)).index_select(-1, cols.to(x.device))

    if not is_pair:
        return cut(input)
    target = sample[1]
    return cut(input), cut(target) if should_resize_target(sample, resize_target) else target
