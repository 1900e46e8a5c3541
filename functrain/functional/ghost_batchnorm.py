"""Ghost batch normalization (Hoffer et al., 2017): normalize small "ghost" batches separately.

In training, the batch is cut into `ceil(B / ghost_batch_size)` chunks, each normalized with its
own statistics, which adds regularizing noise to large-batch training. Each chunk updates the
running statistics with the momentum divided by the number of chunks, so the moving averages
keep roughly their time constant. In eval mode it is exactly BatchNorm.

The ghost modules wrap the BatchNorm they replace as their `batchnorm` child, as Composer's do, so
a state dict has Composer's keys (`<name>.batchnorm.weight`, `.running_mean`, ...) and a
Composer-saved ghost-batchnorm model loads with `strict=True`.

Example:
    >>> bn = apply_ghost_batchnorm(torch.nn.BatchNorm1d(4), ghost_batch_size=2)
    >>> bn(torch.randn(8, 4)).shape
    torch.Size([8, 4])
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules


def ghost_batch_norm(bn: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, ghost_batch_size: int):
    """Training-mode BatchNorm of `x` in chunks of `ghost_batch_size` (updates `bn`'s stats)."""
    chunks = x.chunk(max(math.ceil(x.shape[0] / ghost_batch_size), 1), dim=0)
    track = bn.track_running_stats and bn.running_mean is not None
    outs = []
    for chunk in chunks:
        factor = 0.0
        if track:
            bn.num_batches_tracked.add_(1)
            if bn.momentum is None:  # cumulative moving average over all chunks seen
                factor = 1.0 / float(bn.num_batches_tracked)
            else:
                factor = bn.momentum / len(chunks)
        outs.append(
            F.batch_norm(
                chunk,
                bn.running_mean if track else None,
                bn.running_var if track else None,
                bn.weight,
                bn.bias,
                True,
                factor,
                bn.eps,
            )
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


class _GhostBatchNorm(nn.Module):
    """Holds a BatchNorm as `batchnorm`; normalizes ghost batches with it in training."""

    base: type = nn.modules.batchnorm._BatchNorm

    def __init__(self, batchnorm: nn.modules.batchnorm._BatchNorm, ghost_batch_size: int = 32):
        super().__init__()
        if not isinstance(batchnorm, self.base):
            raise TypeError(f"{type(self).__name__} wraps a {self.base.__name__}")
        self.batchnorm = batchnorm
        self.ghost_batch_size = int(ghost_batch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.batchnorm(x)
        self.batchnorm._check_input_dim(x)
        return ghost_batch_norm(self.batchnorm, x, self.ghost_batch_size)


class GhostBatchNorm1d(_GhostBatchNorm):
    """Ghost batches through an `nn.BatchNorm1d` (its child `batchnorm`)."""

    base = nn.BatchNorm1d


class GhostBatchNorm2d(_GhostBatchNorm):
    """Ghost batches through an `nn.BatchNorm2d` (its child `batchnorm`)."""

    base = nn.BatchNorm2d


class GhostBatchNorm3d(_GhostBatchNorm):
    """Ghost batches through an `nn.BatchNorm3d` (its child `batchnorm`)."""

    base = nn.BatchNorm3d


_GHOST = {
    nn.BatchNorm1d: GhostBatchNorm1d,
    nn.BatchNorm2d: GhostBatchNorm2d,
    nn.BatchNorm3d: GhostBatchNorm3d,
}


def apply_ghost_batchnorm(
    model: nn.Module, ghost_batch_size: int = 32, optimizers: Any = None
) -> nn.Module:
    """A copy of `model` whose BatchNorm{1,2,3}d layers normalize ghost batches in training.

    Args:
        model: the model (not modified).
        ghost_batch_size: samples per ghost batch.
    Returns:
        the new model (the same parameters and buffers, under `<name>.batchnorm.`).
    """
    check_module(model, "apply_ghost_batchnorm")
    reject_optimizers("apply_ghost_batchnorm", optimizers)
    if not isinstance(ghost_batch_size, int) or ghost_batch_size <= 0:
        raise ValueError(f"ghost_batch_size must be a positive int, got {ghost_batch_size!r}")

    def policy(name: str, module: nn.Module):
        cls = _GHOST.get(type(module))
        if cls is None:
            return None
        return cls(module, ghost_batch_size)

    return replace_modules(model, policy)
