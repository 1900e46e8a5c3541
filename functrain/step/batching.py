"""Batch helpers for the step: count samples, split into microbatches, move to a device.

A batch is any pytree whose tensor leaves share a leading batch dimension (a tuple `(x, y)`, a
dict of tensors, ...). Non-tensor leaves are carried unchanged into every microbatch.

Example:
    >>> batch = (torch.zeros(10, 3), torch.zeros(10))
    >>> [num_samples(mb) for mb in split_batch(batch, 4)]
    [4, 4, 2]
"""

from __future__ import annotations

from typing import Any

import torch

from ..data import num_samples  # the one count of a batch's samples
from ..tree import tree_flatten, tree_map, tree_unflatten


def split_batch(batch: Any, microbatch_size: int) -> list[Any]:
    """Split `batch` along its leading dimension into chunks of at most `microbatch_size`."""
    total = num_samples(batch)
    if microbatch_size <= 0:
        raise ValueError(f"microbatch_size must be positive, got {microbatch_size}")
    if microbatch_size >= total:
        return [batch]
    leaves, spec = tree_flatten(batch)
    pieces = []
    for start in range(0, total, microbatch_size):
        stop = min(start + microbatch_size, total)
        pieces.append(
            tree_unflatten(
                spec,
                [
                    x[start:stop]
                    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == total
                    else x
                    for x in leaves
                ],
            )
        )
    return pieces


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Every tensor leaf moved to `device`."""
    return tree_map(
        lambda x: x.to(device, non_blocking=non_blocking) if isinstance(x, torch.Tensor) else x,
        batch,
    )
