"""The step's view of distribution: gather parameters for compute, reduce gradients and metrics.

Parameters on a mesh are DTensors, placed by the state's `Layout` (see `plans`, `layout`). Inside
the step, with `layout = state.layout` and one `InFlight` per forward/backward:

    inflight = InFlight(layout)
    compute = gather_params(leaves, layout, inflight)   # whole local tensors; FSDP: one
                                                        # all-gather per bucket
    with running(model, layout, inflight):
        loss = functional_call(model, compute)          # plain local compute (TP layers sum
                                                        # over `tp`)
    grads = torch.autograd.grad(loss, leaves)    # backward reduces each bucket as soon as it
    grads = finalize_grads(grads, params, layout, inflight)   # is ready: reduce-scatter (FSDP)
                                                              # / all-reduce (DDP)

The reduction is an explicit autograd function per bucket of parameters (flat buffers, see
`flat` and `collectives`), launched asynchronously from the backward pass and finished when that
pass ends, so communication overlaps the rest of the backward pass as in DDP. Gradients come back
placed like the parameters and averaged over the data-parallel ranks. With no layout (one
process, no mesh) every function here is the identity, so the step has one code path.

Example:
    >>> compute = gather_params(leaves, state.layout)
    >>> grads = dict(zip(leaves, torch.autograd.grad(loss_of(compute), list(leaves.values()))))
    >>> grads = finalize_grads(grads, state.params, state.layout)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .. import _torch
from .._lazy import dtensor_loaded, is_dtensor
from . import comm, reshard
from .collectives import BucketCollective, InFlight, gather_bucket, prefetch, reduce_bucket
from .layout import Layout

if TYPE_CHECKING:  # DTensor is imported where one exists, not by `import functrain`
    from torch.distributed.tensor import DTensor

_AT_USE = object()  # a bucket that `reshard` gathers when its module runs


def _no_layout(params: Mapping[str, Any], what: str) -> None:
    """A clear error when DTensors arrive without the layout that placed them."""
    if not dtensor_loaded():  # no DTensor can exist: nothing to walk
        return
    for name, value in params.items():
        if is_dtensor(value):
            raise ValueError(
                f"{what}: parameter {name!r} is a DTensor but no layout was given; pass the "
                "state's layout (state.layout, made by functrain.init(..., mesh=, plan=))"
            )


def _check_layout(layout: Any) -> Layout:
    if not isinstance(layout, Layout):
        raise TypeError(
            f"expected a functrain.parallel.Layout (state.layout) or None, got "
            f"{type(layout).__name__}"
        )
    return layout


def _local_pieces(bucket, params: Mapping[str, Any]) -> list[torch.Tensor]:
    """The bucket's local pieces, checked against the layout (a state from another model or
    layout would otherwise be packed at the wrong offsets)."""
    pieces = []
    for slot in bucket.slots:
        value = params[slot.name]
        local = value.to_local()  # differentiable: gradients flow back to the DTensor
        if local.shape != slot.local_shape or local.dtype != bucket.param_dtype:
            raise ValueError(
                f"parameter {slot.name!r} has a local piece of shape {tuple(local.shape)} and "
                f"dtype {local.dtype}, but its layout expects {slot.local_shape} and "
                f"{bucket.param_dtype}: the parameters and the layout come from different "
                "states; pass the layout of the state the parameters belong to"
            )
        pieces.append(local)
    return pieces


# -- gathering --------------------------------------------------------------------------------


def gather_params(
    params: dict[str, torch.Tensor], layout: Layout | None, inflight: InFlight | None = None
) -> dict[str, torch.Tensor]:
    """Whole local tensors for compute (identity without a layout).

    DTensor parameters sharded on `dp_shard` are all-gathered, one flat collective per bucket,
    all buckets in flight at once; tensor-parallel shards stay local (their layers communicate
    activations). Under autograd the result is differentiable: the backward pass reduces each
    bucket's gradients (reduce-scatter or all-reduce) into gradients of the DTensors.

    Args:
        params: `{name: Tensor | DTensor}` (a subset of the layout's parameters).
        layout: the layout that placed them (`state.layout`); None: no DTensors allowed.
        inflight: the step's `InFlight`. With one, buckets of `reshard_after_forward` stay as
            placeholders that modules gather at use inside `running(...)`; without, everything
            is gathered now.
    Returns:
        `{name: Tensor}` in the same order.
    """
    if layout is None:
        _no_layout(params, "gather_params")
        return params
    buckets = _check_layout(layout).buckets_for(params)
    if not buckets:
        return params
    if inflight is None:
        inflight = InFlight(layout)
        at_use = False
    else:
        # reshard_after_forward: modules gather these at use (not under torch.compile/torch.func,
        # whose tracing the module hooks would not survive: there, gather once as usual)
        at_use = any(b.reshard for b in buckets) and not (
            torch.compiler.is_compiling() or _torch.functorch_transforms_active()
        )
    pieces_of = [_local_pieces(bucket, params) for bucket in buckets]
    prefetched = []
    for bucket, pieces in zip(buckets, pieces_of):  # start every all-gather before waiting
        if at_use and bucket.reshard:
            prefetched.append(_AT_USE)
        elif bucket.sharded:
            with torch.no_grad():
                prefetched.append(prefetch(bucket, layout, pieces))
        else:
            prefetched.append(None)
    out = {}
    for bucket, pieces, pre in zip(buckets, pieces_of, prefetched):
        if pre is _AT_USE:
            wholes = reshard.register(inflight, bucket, layout, pieces)
        elif torch.is_grad_enabled() and any(p.requires_grad for p in pieces):
            wholes = BucketCollective.apply(bucket, layout, inflight, pre, *pieces)
        else:
            with torch.no_grad():
                wholes = gather_bucket(bucket, pieces, pre)
        out.update(zip(bucket.names, wholes))
    return {k: out.get(k, v) for k, v in params.items()}


def finalize_grads(
    grads: dict, params: dict, layout: Layout | None, inflight: InFlight | None = None
) -> dict:
    """Gradients placed like `params` and averaged over data-parallel ranks.

    Gradients produced through `gather_params` are already reduced (this waits for any reduction
    of `inflight` still running). Plain-tensor gradients of DTensor parameters (e.g. accumulated
    outside autograd) are reduced here.

    Args:
        grads: `{name: gradient}` for (a subset of) `params`.
        params: `{name: parameter}`.
        layout: the parameters' layout (None: returns `grads`).
        inflight: the step's `InFlight` whose reductions to finish.
    Returns:
        `{name: gradient}`, DTensors where the parameters are DTensors.
    """
    if inflight is not None:
        inflight.wait()
    if layout is None:
        return grads
    loose = {k: g for k, g in grads.items() if is_dtensor(params.get(k)) and not is_dtensor(g)}
    if not loose:
        return grads
    reduced = reduce_local_grads(loose, {k: params[k] for k in loose}, layout)
    return {k: reduced.get(k, g) for k, g in grads.items()}


def reduce_local_grads(
    local_grads: dict[str, torch.Tensor], params: dict[str, DTensor], layout: Layout
) -> dict:
    """Reduce gradients of whole compute tensors (from `gather_params`) into DTensor gradients.

    For accumulating microbatches without communication: take gradients with respect to the
    gathered tensors, add them up locally, and reduce once with this.

    Args:
        local_grads: `{name: gradient of the compute tensor}` (whole along data-parallel dims).
        params: the matching DTensor parameters.
        layout: their layout.
    Returns:
        `{name: DTensor gradient}` averaged over data-parallel ranks.
    """
    inflight = InFlight(_check_layout(layout))
    out = {}
    for bucket in layout.buckets_for(params):
        if not any(name in local_grads for name in bucket.names):
            continue
        device = params[bucket.names[0]].device
        grads = [
            local_grads[s.name]
            if s.name in local_grads
            else torch.zeros(s.compute_shape, dtype=bucket.compute_dtype, device=device)
            for s in bucket.slots
        ]
        out.update(zip(bucket.names, reduce_bucket(bucket, layout, grads, inflight)))
    inflight.wait()
    from torch.distributed.tensor import DTensor  # loaded: `params` are DTensors

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
    leaves: dict[str, torch.Tensor],
    objectives: list[Callable[[dict], tuple[torch.Tensor, Any]]],
    layout: Layout | None,
    inflight: InFlight | None = None,
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
        layout: the leaves' layout (None: plain tensors).
        inflight: the step's `InFlight` (see `gather_params`).
    Returns:
        `(grads, auxes)`: gradients in the order of `leaves` (zeros where unused), and each
        objective's `(scalar detached, aux)`.
    Example:
        >>> grads, outs = accumulate_grads(leaves, [lambda p: (loss(p, mb), None) for mb in mbs],
        ...                                state.layout)
    """
    names = list(leaves)
    with torch.enable_grad():
        compute = gather_params(leaves, layout, inflight)
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


def mean_over_data_parallel(value: Any, layout: Layout | None) -> Any:
    """The mean of `value` over data-parallel ranks (identity without a layout).

    Args:
        value: a tensor, or a pytree (dict/list/tuple) of tensors: all float leaves travel in one
            all-reduce; other leaves pass through.
        layout: the state's layout, whose data-parallel group to average over.
    Returns:
        the same structure, detached, averaged over the data-parallel ranks.
    """
    if layout is None or _check_layout(layout).dp_size == 1:
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
    comm.all_reduce_(buffer, layout.dp_group)
    buffer.div_(layout.dp_size)
    for i, part in zip(index, buffer.split([p.numel() for p in parts])):
        leaves[i] = part.view(leaves[i].shape).to(leaves[i].dtype)
    return tree_unflatten(spec, leaves)
