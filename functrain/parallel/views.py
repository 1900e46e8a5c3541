"""Whole values of sharded tensors, for callbacks, evaluation and export.

Under FSDP or TP a rank's `state.params` (and gradients, optimizer moments) are DTensors whose
local piece is this rank's shard: `p.to_local().norm()` is a shard's norm, not the parameter's.
Read whole values through these functions instead. They are collectives: every rank must call
them, in the same order (callbacks run on every rank, so calling them from a callback's event
method on every rank at the same steps is right). On plain tensors they cost nothing.

    full_value(tree)        every DTensor leaf of a pytree gathered whole (`full_tensor()`)
    norms(tensors)          the global L2 norm of each tensor, one all-reduce per mesh dim

The norm of everything together is `functrain.optim.global_norm(tree)` (the one that clipping
uses; it handles DTensors the same way).

Example:
    >>> class WeightNorm:
    ...     def batch_end(self, ctx):
    ...         n = functrain.parallel.norms(ctx.state.params)     # all ranks; same on each
    ...         ctx.log({"norm/fc1": float(n["fc1.weight"])})
    >>> whole = functrain.parallel.full_value(ctx.state.params)     # {name: whole Tensor}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from .._lazy import is_dtensor
from . import comm


def full_value(tree: Any) -> Any:
    """`tree` with every DTensor leaf gathered whole on every rank; other leaves unchanged.

    Args:
        tree: a tensor, or any pytree of tensors (params, gradients, `state.opt_state`).
    Returns:
        the same structure with plain tensors. A collective when there are DTensors.
    """
    from ..tree import tree_map

    return tree_map(lambda x: x.full_tensor() if is_dtensor(x) else x, tree)


def full_params(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors on every rank (`DTensor.full_tensor()`); plain tensors unchanged."""
    return {k: (v.full_tensor() if is_dtensor(v) else v) for k, v in params.items()}


def norms(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The L2 norm of each whole tensor, as 0-d float32 tensors, the same on every rank.

    DTensors count their global value: each rank sums the squares of its local piece, divided
    by the number of ranks holding an identical copy (replicated dims), and one all-reduce per
    mesh dim adds the pieces of all tensors at once. Partial (unreduced) DTensors are reduced
    first. Not differentiable.

    Args:
        tensors: `{name: Tensor | DTensor}`.
    Returns:
        `{name: 0-d tensor}` in the same order (on the device of the tensors).
    Example:
        >>> norms({"w": torch.tensor([3.0, 4.0])})["w"]
        tensor(5.)
    """
    out: dict[str, torch.Tensor] = {}
    by_mesh: dict[Any, list[tuple[str, torch.Tensor, float]]] = {}
    with torch.no_grad():
        for name, x in tensors.items():
            if not is_dtensor(x):
                out[name] = torch.linalg.vector_norm(x.detach(), dtype=torch.float32)
            elif any(p.is_partial() for p in x.placements):
                out[name] = torch.linalg.vector_norm(x.full_tensor(), dtype=torch.float32)
            else:
                mesh = x.device_mesh
                replicas = math.prod(
                    mesh.size(i) for i, p in enumerate(x.placements) if p.is_replicate()
                )
                by_mesh.setdefault(mesh, []).append((name, x.to_local().detach(), replicas))
        for mesh, entries in by_mesh.items():
            squares = torch.stack(
                [
                    torch.linalg.vector_norm(local, dtype=torch.float32).square() / replicas
                    for _, local, replicas in entries
                ]
            )
            for dim in range(mesh.ndim):  # summing over every dim sums over the whole mesh
                if mesh.size(dim) > 1:
                    comm.all_reduce_(squares, mesh.get_group(dim))
            for (name, _, _), square in zip(entries, squares.sqrt()):
                out[name] = square
    return {name: out[name] for name in tensors}
