"""Synchronised batch statistics: BatchNorm over the global batch of all data-parallel ranks.

Plain BatchNorm under data parallelism normalises each rank's batch by that batch's own mean and
variance, so N ranks train a different model from one process on the same global batch (and
their running statistics differ, which the step settles by taking rank 0's; see `buffers`).
`sync_batchnorm(model, mesh)` replaces every BatchNorm of `model` by a `SyncBatchNorm` whose
training forward takes the mean and variance of the global batch (two differentiable all-reduces
over the data-parallel group), so N ranks equal one process on the global batch, gradients
included, as torch's `nn.SyncBatchNorm` (which needs a GPU) does. Parameters and buffers keep
their names and values: a checkpoint loads either way.

The module keeps the data-parallel *mesh*, not a process group, and looks the group up when it
runs, so a model alive at exit does not keep the group alive (see `teardown`).

Example:
    >>> mesh = functrain.parallel.init_mesh()
    >>> model = sync_batchnorm(Net(), mesh)            # before functrain.init
    >>> state = functrain.init(model, opt, mesh=mesh, plan="ddp")
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import comm
from .mesh import check_mesh, dp_mesh

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _AllReduceSum(torch.autograd.Function):
    """The sum over `group` of every rank's tensor; its gradient is the sum of the ranks'
    gradients (each rank's loss depends on every rank's tensor through the sum)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        total = tensor.clone(memory_format=torch.contiguous_format)
        comm.all_reduce_(total, group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _AllReduceSum.apply(grad, ctx.group), None


class SyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm over the global batch of the data-parallel ranks (any input of 2+ dims).

    Args:
        num_features, eps, momentum, affine, track_running_stats: as `nn.BatchNorm2d`.
        dp_mesh: the 1-D data-parallel mesh (`parallel.mesh.dp_mesh(mesh)`); None: one process.
    """

    def __init__(self, num_features: int, *args: Any, dp_mesh: Any = None, **kwargs: Any):
        super().__init__(num_features, *args, **kwargs)
        self.dp_mesh = dp_mesh

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        group = None if self.dp_mesh is None else self.dp_mesh.get_group()
        if not self.training or group is None or group.size() == 1:
            return super().forward(input)
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        local = torch.tensor([input.numel() // input.shape[1]], dtype=input.dtype)
        count = _AllReduceSum.apply(local.to(input.device), group)  # the global batch's size
        mean = _AllReduceSum.apply(input.sum(dims), group) / count
        centred = input - mean.view(shape)
        var = _AllReduceSum.apply((centred * centred).sum(dims), group) / count
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running_stats(mean.detach(), var.detach(), count)
        return out

    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count) -> None:
        """As `F.batch_norm`: the unbiased variance; momentum None is a cumulative average."""
        assert self.running_mean is not None and self.running_var is not None
        with torch.no_grad():
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
            if self.momentum is None:
                assert self.num_batches_tracked is not None
                momentum = 1.0 / float(self.num_batches_tracked)
            else:
                momentum = self.momentum
            n = float(count)
            unbiased = var * (n / max(n - 1.0, 1.0))
            self.running_mean.mul_(1 - momentum).add_(mean.to(self.running_mean.dtype) * momentum)
            self.running_var.mul_(1 - momentum).add_(unbiased.to(self.running_var.dtype) * momentum)


def sync_batchnorm(model: nn.Module, mesh: Any) -> nn.Module:
    """`model` with every BatchNorm (1d/2d/3d) replaced by a `SyncBatchNorm` over `mesh`'s
    data-parallel ranks, keeping its parameters, buffers and names (in place; returned).

    Args:
        model: the module (before `functrain.init`).
        mesh: a mesh from `functrain.parallel.init_mesh`.
    Returns:
        `model` (or its replacement when `model` itself is a BatchNorm).
    Example:
        >>> model = sync_batchnorm(model, mesh)
    """
    group_mesh = dp_mesh(check_mesh(mesh))
    if isinstance(model, _BATCHNORMS):
        return _converted(model, group_mesh)
    for name, child in list(model.named_children()):
        setattr(model, name, sync_batchnorm(child, mesh))
    return model


def _converted(bn: Any, group_mesh: Any) -> SyncBatchNorm:
    tensors = list(bn.state_dict().values())
    new = SyncBatchNorm(
        bn.num_features,
        bn.eps,
        bn.momentum,
        bn.affine,
        bn.track_running_stats,
        dp_mesh=group_mesh,
        device=tensors[0].device if tensors else None,
    )
    new.load_state_dict(bn.state_dict())
    new.train(bn.training)
    return new
