"""Ghost batch normalization (Hoffer et al., 2017): normalize small "ghost" batches separately.

In training, the batch is cut into `ceil(B / ghost_batch_size)` chunks, each normalized with its
own statistics, which adds regularizing noise to large-batch training. Each chunk updates the
running statistics with the momentum divided by the number of chunks, so the moving averages
keep roughly their time constant. In eval mode it is exactly BatchNorm.

The ghost modules subclass the BatchNorm classes, so parameter and buffer names are unchanged.

Example:
    >>> bn = apply_ghost_batchnorm(torch.nn.BatchNorm1d(4), ghost_batch_size=2)
    >>> bn(torch.randn(8, 4)).shape
    torch.Size([8, 4])
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .module_surgery import check_module, reclass, replace_modules


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


class _GhostMixin:
    ghost_batch_size: int = 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        self._check_input_dim(x)
        return ghost_batch_norm(self, x, self.ghost_batch_size)


class GhostBatchNorm1d(_GhostMixin, nn.BatchNorm1d):
    """`nn.BatchNorm1d` that normalizes ghost batches in training."""


class GhostBatchNorm2d(_GhostMixin, nn.BatchNorm2d):
    """`nn.BatchNorm2d` that normalizes ghost batches in training."""


class GhostBatchNorm3d(_GhostMixin, nn.BatchNorm3d):
    """`nn.BatchNorm3d` that normalizes ghost batches in training."""


_GHOST = {
    nn.BatchNorm1d: GhostBatchNorm1d,
    nn.BatchNorm2d: GhostBatchNorm2d,
    nn.BatchNorm3d: GhostBatchNorm3d,
}


def apply_ghost_batchnorm(model: nn.Module, ghost_batch_size: int = 32) -> nn.Module:
    """A copy of `model` whose BatchNorm{1,2,3}d layers normalize ghost batches in training.

    Args:
        model: the model (not modified).
        ghost_batch_size: samples per ghost batch.
    Returns:
        the new model (same parameters and buffers).
    """
    check_module(model, "apply_ghost_batchnorm")
    if not isinstance(ghost_batch_size, int) or ghost_batch_size <= 0:
        raise ValueError(f"ghost_batch_size must be a positive int, got {ghost_batch_size!r}")

    def policy(name: str, module: nn.Module):
        cls = _GHOST.get(type(module))
        if cls is None:
            return None
        new = reclass(module, cls)
        new.ghost_batch_size = ghost_batch_size
        return new

    return replace_modules(model, policy)
