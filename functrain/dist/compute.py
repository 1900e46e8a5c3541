"""The step's view of distribution: gather parameters for compute, reduce gradients and metrics.

Without DTensors (one process, no mesh) every function here is the identity, so the step has one
code path. (The distribution issue replaces these with the DTensor versions.)
"""

from __future__ import annotations

import torch


def gather_params(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full local tensors for compute (identity without DTensors)."""
    return params


def finalize_grads(grads: dict, params: dict) -> dict:
    """Gradients placed like `params` and averaged over data-parallel ranks."""
    return grads


def mean_over_data_parallel(value: torch.Tensor) -> torch.Tensor:
    """The mean of `value` over data-parallel ranks (identity on one process)."""
    return value


def data_parallel_info() -> tuple[int, int]:
    """`(rank, world_size)` of the data-parallel group."""
    return 0, 1
