"""Buffers across data-parallel ranks: rank 0's, on every rank, after every step.

A module's buffers that the forward pass updates (BatchNorm's running mean and variance) move
with each rank's own batch, so under `ddp`, `fsdp` or `hsdp` they would drift apart: the
checkpoint keeps one copy, and a run resumed from it would evaluate differently from the run that
wrote it. The step therefore makes them identical after each forward pass, as torch's
`DistributedDataParallel(broadcast_buffers=True)` does: every data-parallel rank takes rank 0's.

Why rank 0's and not the average: a broadcast is exact for every buffer (an average of equal
values is not exact on 3 ranks, and a constant buffer, such as a mask, must not change), and it is
what a torch DDP user expects. For N ranks to equal one process, the forward pass itself must use
the global batch's statistics: `parallel.sync_bn.sync_batchnorm(model, mesh)` does that.

Integer buffers (BatchNorm's `num_batches_tracked`) advance alike on every rank and are left as
they are; floating-point buffers travel in one broadcast per dtype.

Example:
    >>> buffers = broadcast_buffers(result.buffers, state.layout)   # in place; the same dict
"""

from __future__ import annotations

from typing import Any

import torch

from .._lazy import is_dtensor
from . import comm
from .layout import Layout


def broadcast_buffers(buffers: dict[str, Any], layout: Layout | None) -> dict[str, Any]:
    """Overwrite each floating-point buffer of `buffers` with data-parallel rank 0's, in place.

    Args:
        buffers: `{name: tensor}` this step owns (updated in place).
        layout: the state's layout (None, or one data-parallel rank: nothing to do).
    Returns:
        `buffers` itself.
    """
    if layout is None or layout.dp_size == 1 or not buffers:
        return buffers
    floats = [
        b
        for b in buffers.values()
        if isinstance(b, torch.Tensor) and b.is_floating_point() and not is_dtensor(b)
    ]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in floats:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    group = layout.dp_group
    for dtype in sorted(by_dtype, key=str):  # the same order on every rank
        tensors = by_dtype[dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        comm.broadcast_(flat, 0, group)
        with torch.no_grad():
            for tensor, part in zip(tensors, flat.split([t.numel() for t in tensors])):
                tensor.copy_(part.view(tensor.shape))
    return buffers
