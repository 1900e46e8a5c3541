"""The step's view of distribution: gather parameters for compute, reduce gradients and metrics.

Parameters on a mesh are DTensors (see `plans`). Inside the step:

    compute = gather_params(leaves)          # whole local tensors; FSDP: one all-gather per bucket
    loss = functional_call(model, compute)   # plain local compute (TP layers sum over `tp`)
    grads = torch.autograd.grad(loss, leaves)   # backward reduces each bucket as soon as it is
    grads = finalize_grads(grads, params)        # ready: reduce-scatter (FSDP) / all-reduce (DDP)

The reduction is an explicit autograd function per bucket of parameters (flat buffers, see
`flat`), launched asynchronously from the backward pass and awaited when that pass ends, so
communication overlaps the rest of the backward pass as in DDP. Gradients come back placed like
the parameters and averaged over the data-parallel ranks. Without DTensors (one process, no mesh)
every function here is the identity, so the step has one code path.

Example:
    >>> compute = gather_params(leaves)
    >>> grads = dict(zip(leaves, torch.autograd.grad(loss_of(compute), list(leaves.values()))))
    >>> grads = finalize_grads(grads, state.params)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from . import comm, flat, reshard
from .mesh import (
    MESH_DIMS,
    current_mesh,
    dim_group,
    dim_rank,
    dim_size,
    dp_group,
    dp_rank,
    dp_size,
)


@dataclasses.dataclass(frozen=True)
class ParamPolicy:
    """Per-parameter communication settings recorded by `plans.shard_params`.

    Attributes:
        param_dtype: dtype parameters are gathered and computed in (None: their own).
        reduce_dtype: dtype gradients are reduced in (None: the compute dtype).
        bucket_bytes: bytes per flat bucket.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    bucket_bytes: int = 25 << 20
    reshard: bool = False

    @classmethod
    def from_plan(cls, plan) -> ParamPolicy:
        return cls(
            plan.param_dtype,
            plan.reduce_dtype,
            int(plan.bucket_mb * (1 << 20)),
            plan.reshard_after_forward,
        )


_policies: dict[str, ParamPolicy] = {}
_AT_USE = object()  # a bucket that `reshard` gathers when its module runs
_layouts: dict[tuple, list[flat.Bucket]] = {}
_pending: list = []  # (work, finish) of reductions launched by the current backward pass
_callback_queued = False


def register_policies(policies: dict[str, ParamPolicy]) -> None:
    """Record the communication settings of parameters by name (the latest plan wins)."""
    _policies.update(policies)
    _layouts.clear()


def _is_dtensor(x: Any) -> bool:
    return isinstance(x, DTensor)


def _mesh_of(params: dict) -> Any:
    for value in params.values():
        if _is_dtensor(value):
            return value.device_mesh
    return None


# -- gathering --------------------------------------------------------------------------------


def _layout(params: dict[str, DTensor], mesh) -> list[flat.Bucket]:
    """The buckets for these parameters (cached on names, shapes, placements and dtypes)."""
    key = (mesh,) + tuple(
        (name, tuple(p.shape), p.placements, p.dtype, p.requires_grad) for name, p in params.items()
    )
    layout = _layouts.get(key)
    if layout is not None:
        return layout
    for name, p in params.items():
        _check_placements(name, p)
    n = dim_size(mesh, "dp_shard")
    rank = dim_rank(mesh, "dp_shard")
    entries = []
    cap = None
    for name, p in params.items():
        policy = _policies.get(name, ParamPolicy())
        cap = policy.bucket_bytes if cap is None else cap
        compute_dtype = policy.param_dtype or p.dtype
        reduce_dtype = policy.reduce_dtype or compute_dtype
        local_shape = tuple(p.to_local().shape)
        shard = p.placements[1]
        if isinstance(shard, Shard) and n > 1:
            compute_shape = list(local_shape)
            compute_shape[shard.dim] = p.shape[shard.dim]
            slot = flat.make_slot(name, tuple(compute_shape), shard.dim, n, rank, 0)
            mode = "shard"
            if policy.reshard and p.requires_grad:  # one bucket per module: gathered at use
                mode += "/reshard=" + name.rpartition(".")[0]
        else:
            slot = flat.make_slot(name, local_shape, None, 1, 0, 0)
            mode = "replicate"
        # frozen parameters never need a gradient bucket: keep them apart
        entries.append(
            (
                slot,
                mode if p.requires_grad else mode + "/frozen",
                compute_dtype,
                reduce_dtype,
                p.dtype,
            )
        )
    layout = flat.build_buckets(entries, cap or (25 << 20))
    if len(_layouts) >= 64:  # a few parameter sets per run; never grow without bound
        _layouts.clear()
    _layouts[key] = layout
    return layout


def _check_placements(name: str, p: DTensor) -> None:
    mesh = p.device_mesh
    if tuple(mesh.mesh_dim_names or ()) != MESH_DIMS:
        raise ValueError(
            f"parameter {name} is a DTensor on a mesh with dims {mesh.mesh_dim_names}; functrain "
            f"expects {MESH_DIMS} (place parameters with functrain.init(..., mesh=, plan=))"
        )
    if any(isinstance(pl, Partial) for pl in p.placements):
        raise ValueError(f"parameter {name} has a Partial placement; parameters must be whole")
    if not isinstance(p.placements[0], Replicate):
        raise ValueError(
            f"parameter {name} is sharded on dp_replicate ({p.placements[0]}); that dim only "
            "replicates (shard on dp_shard instead)"
        )


def _device(params: dict) -> torch.device:
    return next(iter(params.values())).device


class _BucketCollective(torch.autograd.Function):
    """Local pieces -> whole compute tensors; backward reduces the gradients of the bucket.

    Forward: "shard" waits for the prefetched all-gather and unpacks it; "replicate" casts.
    Backward: packs the gradients into one flat buffer, launches one reduce-scatter (then an
    all-reduce over `dp_replicate` for HSDP) or one all-reduce, and returns tensors that the
    end-of-backward callback fills once the collective has finished.
    """

    @staticmethod
    def forward(ctx, bucket, mesh, prefetched, *locals_):
        ctx.bucket, ctx.mesh = bucket, mesh
        ctx.regather_key = id(locals_[0])  # see `reshard`: what the backward pass gathered again
        return tuple(_gather_bucket(bucket, locals_, prefetched))

    @staticmethod
    def backward(ctx, *grads):
        reshard.release(ctx.regather_key)  # every use of the bucket's params is behind us
        results = _reduce_bucket(ctx.bucket, ctx.mesh, list(grads))
        return (None, None, None, *results)


def _prefetch(bucket: flat.Bucket, mesh, locals_: list[torch.Tensor]):
    """Start the all-gather of a "shard" bucket; return `(work, gathered)`."""
    send = locals_[0].new_empty(bucket.segment, dtype=bucket.compute_dtype)
    flat.pack_shards(bucket, locals_, send)
    gathered = send.new_empty(bucket.n * bucket.segment)
    work = comm.all_gather_into(gathered, send, dim_group(mesh, "dp_shard"), async_op=True)
    return work, gathered


def _gather_bucket(bucket: flat.Bucket, locals_, prefetched) -> list[torch.Tensor]:
    if bucket.kind == "replicate":
        return [x.to(bucket.compute_dtype).view_as(x) for x in locals_]
    work, gathered = prefetched
    if work is not None:
        work.wait()
    return flat.unpack_gathered(bucket, gathered)


def _reduce_bucket(bucket: flat.Bucket, mesh, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Launch the bucket's reduction; return gradient tensors valid once the backward ends."""
    global _callback_queued
    world = dp_size(mesh)
    if world == 1:  # nothing to reduce: just the dtype
        return [g.to(bucket.param_dtype) for g in grads]
    first = grads[0]
    if bucket.kind == "replicate":
        buffer = first.new_empty(bucket.segment, dtype=bucket.reduce_dtype)
        flat.pack_grads(bucket, grads, buffer)
        reduced = buffer
        work = comm.all_reduce_(buffer, dp_group(mesh), async_op=True)
        follow_group = None
    else:
        send = first.new_empty(bucket.n * bucket.segment, dtype=bucket.reduce_dtype)
        flat.pack_grads(bucket, grads, send)
        reduced = send.new_empty(bucket.segment)
        work = comm.reduce_scatter_into(reduced, send, dim_group(mesh, "dp_shard"), async_op=True)
        follow_group = (
            dim_group(mesh, "dp_replicate") if dim_size(mesh, "dp_replicate") > 1 else None
        )
    views = flat.unpack_reduced(bucket, reduced)
    direct = bucket.reduce_dtype == bucket.param_dtype
    results = [
        v
        if direct and v.is_contiguous()
        else torch.empty(v.shape, dtype=bucket.param_dtype, device=v.device)
        for v in views
    ]

    def finish():
        if follow_group is not None:  # HSDP: the shards' replicas sum across dp_replicate
            comm.all_reduce_(reduced, follow_group)
        reduced.div_(world)
        copies = [(r, v) for r, v in zip(results, views) if r is not v]
        if copies:
            torch._foreach_copy_([r for r, _ in copies], [v for _, v in copies])

    if bucket.reshard:
        # Gathered at use, a bucket may be gathered (and so reduced) more than once per pass
        # (tied weights, microbatches), and autograd adds those gradients up as soon as they
        # are returned: finish now rather than at the end of the pass.
        if work is not None:
            work.wait()
        finish()
        return results
    _pending.append((work, finish))
    if not _callback_queued and torch._C._current_graph_task_id() != -1:  # inside a backward
        _callback_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(wait_for_reductions)
    return results


def wait_for_reductions() -> None:
    """Finish every gradient reduction launched so far (runs when a backward pass ends)."""
    global _callback_queued
    _callback_queued = False
    reshard.release_all()
    while _pending:
        work, finish = _pending.pop(0)
        if work is not None:
            work.wait()
        finish()


def gather_params(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole local tensors for compute (identity without DTensors).

    DTensor parameters sharded on `dp_shard` are all-gathered, one flat collective per bucket,
    all buckets in flight at once; tensor-parallel shards stay local (their layers communicate
    activations). Under autograd the result is differentiable: the backward pass reduces each
    bucket's gradients (reduce-scatter or all-reduce) into gradients of the DTensors.

    Args:
        params: `{name: Tensor | DTensor}`.
    Returns:
        `{name: Tensor}` in the same order.
    """
    dtensors = {k: v for k, v in params.items() if _is_dtensor(v)}
    if not dtensors:
        return params
    mesh = next(iter(dtensors.values())).device_mesh
    layout = _layout(dtensors, mesh)
    locals_ = {k: v.to_local() for k, v in dtensors.items()}  # differentiable: grads -> DTensors
    # reshard_after_forward: modules gather these at use (not under torch.compile/torch.func,
    # whose tracing the module hooks would not survive: there, gather once as usual)
    at_use = any(b.reshard for b in layout) and not (
        torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
    )
    if at_use:
        reshard.reset()
    prefetched = []
    for bucket in layout:  # start every all-gather before waiting on the first
        pieces = [locals_[s.name] for s in bucket.slots]
        if at_use and bucket.reshard:
            prefetched.append(_AT_USE)
        elif bucket.kind == "shard":
            with torch.no_grad():
                prefetched.append(_prefetch(bucket, mesh, pieces))
        else:
            prefetched.append(None)
    out = {}
    for bucket, pre in zip(layout, prefetched):
        pieces = [locals_[s.name] for s in bucket.slots]
        if pre is _AT_USE:
            wholes = reshard.register(bucket, mesh, pieces)
        elif torch.is_grad_enabled() and any(p.requires_grad for p in pieces):
            wholes = _BucketCollective.apply(bucket, mesh, pre, *pieces)
        else:
            with torch.no_grad():
                wholes = _gather_bucket(bucket, pieces, pre)
        out.update(zip((s.name for s in bucket.slots), wholes))
    return {k: out.get(k, v) for k, v in params.items()}


def finalize_grads(grads: dict, params: dict) -> dict:
    """Gradients placed like `params` and averaged over data-parallel ranks.

    Gradients produced through `gather_params` are already reduced (this waits for any reduction
    still in flight). Plain-tensor gradients of DTensor parameters (e.g. accumulated outside
    autograd) are reduced here.

    Args:
        grads: `{name: gradient}` for (a subset of) `params`.
        params: `{name: parameter}`.
    Returns:
        `{name: gradient}`, DTensors where the parameters are DTensors.
    """
    wait_for_reductions()
    loose = {k: g for k, g in grads.items() if _is_dtensor(params.get(k)) and not _is_dtensor(g)}
    if not loose:
        return grads
    reduced = reduce_local_grads(loose, {k: params[k] for k in loose})
    return {k: reduced.get(k, g) for k, g in grads.items()}


def reduce_local_grads(local_grads: dict[str, torch.Tensor], params: dict[str, DTensor]) -> dict:
    """Reduce gradients of whole compute tensors (from `gather_params`) into DTensor gradients.

    For accumulating microbatches without communication: take gradients with respect to the
    gathered tensors, add them up locally, and reduce once with this.

    Args:
        local_grads: `{name: gradient of the compute tensor}` (whole along data-parallel dims).
        params: the matching DTensor parameters.
    Returns:
        `{name: DTensor gradient}` averaged over data-parallel ranks.
    """
    mesh = _mesh_of(params)
    layout = _layout(params, mesh)
    out = {}
    for bucket in layout:
        if not any(s.name in local_grads for s in bucket.slots):
            continue
        grads = [
            local_grads[s.name]
            if s.name in local_grads
            else torch.zeros(s.compute_shape, dtype=bucket.compute_dtype, device=_device(params))
            for s in bucket.slots
        ]
        results = _reduce_bucket(bucket, mesh, grads)
        out.update(zip((s.name for s in bucket.slots), results))
    wait_for_reductions()
    return {
        k: DTensor.from_local(
            out[k],
            params[k].device_mesh,
            params[k].placements,
            shape=params[k].shape,
            stride=params[k].stride(),
        )
        for k in local_grads
    }


def accumulate_grads(
    leaves: dict[str, torch.Tensor], objectives: list[Callable[[dict], tuple[torch.Tensor, Any]]]
) -> tuple[list[torch.Tensor], list[Any]]:
    """Gradients of the sum of `objectives` w.r.t. `leaves`, gathering and reducing only once.

    Microbatching without redundant communication: the parameters are gathered once, every
    microbatch but the last is differentiated only down to the gathered tensors (local, no
    collective), and the last backward pass carries the accumulated gradients into the one
    reduction per bucket (overlapping its own backward, as DDP's `no_sync` + final step does).

    Args:
        leaves: `{name: parameter}` requiring grad (Tensors or DTensors).
        objectives: callables `objective(compute_params) -> (scalar, aux)`, one per microbatch;
            the scalars are summed (weight them inside).
    Returns:
        `(grads, auxes)`: gradients in the order of `leaves` (zeros where unused), and each
        objective's `(scalar detached, aux)`.
    Example:
        >>> grads, outs = accumulate_grads(leaves, [lambda p: (loss(p, mb), None) for mb in mbs])
    """
    names = list(leaves)
    with torch.enable_grad():
        compute = gather_params(leaves)
    targets = [compute[k] for k in names]
    pending: list[torch.Tensor | None] = [None] * len(names)
    outs = []
    for index, objective in enumerate(objectives):
        last = index == len(objectives) - 1
        with torch.enable_grad():
            value, aux = objective(compute)
        outs.append((value.detach(), aux))
        if not last:  # stop at the gathered tensors: local gradients, no communication
            local = torch.autograd.grad(value, targets, allow_unused=True, retain_graph=False)
            for i, g in enumerate(local):
                if g is not None:
                    pending[i] = g if pending[i] is None else pending[i].add_(g)
            continue
        carry = [(t, g) for t, g in zip(targets, pending) if g is not None]
        grads = torch.autograd.grad(
            [value] + [t for t, _ in carry],
            list(leaves.values()),
            grad_outputs=[None] + [g for _, g in carry],
            allow_unused=True,
        )
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, leaves.values())]
    return grads, outs


# -- metrics ----------------------------------------------------------------------------------


def mean_over_data_parallel(value: Any) -> Any:
    """The mean of `value` over data-parallel ranks (identity on one process).

    Args:
        value: a tensor, or a pytree (dict/list/tuple) of tensors: all float leaves travel in one
            all-reduce; other leaves pass through.
    Returns:
        the same structure, detached, averaged over the data-parallel ranks.
    """
    mesh = current_mesh()
    if mesh is None or dp_size(mesh) == 1:
        return value
    from ..tree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(value)
    index = [
        i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.is_floating_point()
    ]
    if not index:
        return value
    parts = [leaves[i].detach().float().reshape(-1) for i in index]
    buffer = torch.cat(parts)
    comm.all_reduce_(buffer, dp_group(mesh))
    buffer.div_(dp_size(mesh))
    for i, part in zip(index, buffer.split([p.numel() for p in parts])):
        leaves[i] = part.view(leaves[i].shape).to(leaves[i].dtype)
    return tree_unflatten(spec, leaves)


def data_parallel_info() -> tuple[int, int]:
    """`(rank, world_size)` of the data-parallel group (TP ranks of one replica share a rank)."""
    mesh = current_mesh()
    if mesh is None:
        return 0, 1
    return dp_rank(mesh), dp_size(mesh)


# -- whole tensors ----------------------------------------------------------------------------
# (The global norm of sharded gradients is `functrain.optim.global_norm`, re-exported as
# `functrain.parallel.global_norm`.)


def full_params(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors on every rank (`DTensor.full_tensor()`); plain tensors unchanged."""
    return {k: (v.full_tensor() if _is_dtensor(v) else v) for k, v in params.items()}
