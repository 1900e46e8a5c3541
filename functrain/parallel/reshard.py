"""Gather at use, free after use: FSDP's `reshard_after_forward` for functrain's step.

By default an FSDP step gathers every sharded parameter once, before the forward pass, and keeps
the whole tensors until the backward pass ends: the least communication, but each rank holds the
whole model during a step. With `fsdp(reshard_after_forward=True)` each module's parameters are
gathered when that module runs and freed when it returns, and gathered again in the backward pass
when autograd needs them, so a rank holds the whole parameters of about one module at a time:

    gather_params(leaves, layout, inflight)
                                 sharded params stay as their local pieces ("placeholders"),
                                 recorded in the step's `InFlight`
    with gathering_at_use(inflight):
        loss = model(batch)      a module's forward pre-hook swaps its placeholders for gathered
                                 whole tensors; its forward hook swaps them back; tensors that
                                 autograd saves from them are stored as handles, not copies
    backward                     a handle's first unpack gathers its bucket again; the bucket's
                                 gradient reduction (reduce-scatter) releases it

This costs one more all-gather per module and step (3x parameter bytes per step instead of 2x,
as PyTorch's FSDP2), and each microbatch gathers and reduces on its own.

Example:
    >>> state = functrain.init(model, opt, mesh=mesh, plan=fsdp(reshard_after_forward=True))
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .. import _torch
from .collectives import BucketCollective, InFlight, gather_detached, prefetch

if TYPE_CHECKING:
    from .layout import Layout


class _Saved(NamedTuple):
    """What autograd keeps instead of a view of a gathered parameter: how to rebuild it."""

    bucket: Any
    layout: Any
    pieces: list
    index: int
    size: torch.Size
    stride: tuple[int, ...]
    offset: int  # storage offset relative to the whole tensor's


def register(
    inflight: InFlight, bucket, layout: Layout, pieces: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Make `pieces` (a bucket's local shards) the placeholders its modules will gather at use.

    Returns:
        `pieces`, to stand in for the whole tensors in the parameters given to the model.
    """
    for index, piece in enumerate(pieces):
        inflight.placeholders[id(piece)] = (bucket, layout, pieces, index)
    return pieces


@contextlib.contextmanager
def gathering_at_use(inflight: InFlight | None) -> Iterator[None]:
    """While active, modules gather the placeholder parameters recorded in `inflight` when they
    are called (see the module docstring). A no-op when there are none (no plan with
    reshard_after_forward, or None). The step installs it as one of its `ForwardRun`'s
    installers, which also hands `inflight` to the algorithms that need it (offload,
    activation checkpointing): `run.gathered_at_use`."""
    if inflight is None or not inflight.placeholders:
        yield
        return

    try:
        with (
            gathering_modules(inflight),
            # a partial, not a closure: it runs for every saved tensor
            torch.autograd.graph.saved_tensors_hooks(
                functools.partial(_pack, inflight), functools.partial(_unpack, inflight)
            ),
        ):
            yield
    except RuntimeError as error:
        error.add_note(
            "functrain: with fsdp(reshard_after_forward=True) a parameter is whole only while "
            "the module that owns it runs; elsewhere it is this rank's shard. If the model uses "
            "a parameter outside its module (e.g. F.linear(x, self.embed.weight) in a parent), "
            "call that module instead, or use plan='fsdp' (gathered once per step)."
        )
        raise
    finally:
        inflight.restore.clear()


@contextlib.contextmanager
def gathering_modules(inflight: InFlight | None) -> Iterator[None]:
    """Only the module hooks of `gathering_at_use` (no saved-tensor hooks): what a recomputation
    in the backward pass needs, since autograd's checkpoint keeps the tensors it recomputes."""
    if inflight is None or not inflight.placeholders:
        yield
        return
    # partials, not closures: these run for every module call
    pre = torch.nn.modules.module.register_module_forward_pre_hook(
        functools.partial(_before_module, inflight)
    )
    post = torch.nn.modules.module.register_module_forward_hook(
        functools.partial(_after_module, inflight), always_call=True
    )
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def pack_saved(inflight: InFlight, tensor: torch.Tensor) -> Any:
    """A handle for a tensor viewing a gathered whole parameter (`tensor` itself otherwise)."""
    return _pack(inflight, tensor)


def unpack_saved(inflight: InFlight, saved: Any) -> torch.Tensor:
    """The tensor `pack_saved` stood for (gathered again if it was a handle)."""
    return _unpack(inflight, saved)


def is_handle(saved: Any) -> bool:
    """True when `saved` (from `pack_saved`) is a handle rather than the tensor itself."""
    return isinstance(saved, _Saved)


def _before_module(inflight: InFlight, module: torch.nn.Module, args: Any = None) -> None:
    placeholders = inflight.placeholders
    found = [
        (name, placeholders[id(value)])
        for name, value in _torch.parameter_slots(module).items()
        if value is not None and id(value) in placeholders
    ]
    if not found:
        inflight.restore.setdefault(id(module), []).append([])
        return
    wholes: dict[int, list[torch.Tensor]] = {}
    for _, (bucket, layout, pieces, _) in found:
        key = id(pieces[0])
        if key not in wholes:
            wholes[key] = _gather(inflight, bucket, layout, pieces)
    swapped = []
    slots = _torch.parameter_slots(module)
    for name, (_, _, pieces, index) in found:
        swapped.append((name, slots[name]))
        slots[name] = wholes[id(pieces[0])][index]
    inflight.restore.setdefault(id(module), []).append(swapped)


def _after_module(inflight: InFlight, module: torch.nn.Module, args: Any, output: Any) -> None:
    stack = inflight.restore.get(id(module))
    if stack:
        slots = _torch.parameter_slots(module)
        for name, placeholder in stack.pop():
            slots[name] = placeholder


def _gather(inflight: InFlight, bucket, layout, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """The bucket's whole tensors: differentiable (gradients reduce-scattered) under autograd."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in pieces):
        with torch.no_grad():
            prefetched = prefetch(bucket, layout, pieces)
        wholes = list(BucketCollective.apply(bucket, layout, inflight, prefetched, *pieces))
    else:
        wholes = gather_detached(bucket, layout, pieces)
    for index, whole in enumerate(wholes):
        inflight.live[whole.untyped_storage().data_ptr()] = (
            weakref.ref(whole),
            bucket,
            layout,
            pieces,
            index,
        )
    return wholes


def _pack(inflight: InFlight, tensor: torch.Tensor) -> Any:
    if type(tensor) is not torch.Tensor or tensor.device.type == "meta":
        return tensor
    address = tensor.untyped_storage().data_ptr()
    entry = inflight.live.get(address)
    if entry is None:
        return tensor
    ref, bucket, layout, pieces, index = entry
    whole = ref()
    if whole is None or whole.untyped_storage().data_ptr() != address:
        return tensor  # a freed whole's address, reused by an unrelated tensor
    return _Saved(
        bucket,
        layout,
        pieces,
        index,
        tensor.size(),
        tensor.stride(),
        tensor.storage_offset() - whole.storage_offset(),
    )


def _unpack(inflight: InFlight, saved: Any) -> torch.Tensor:
    if not isinstance(saved, _Saved):
        return saved
    key = id(saved.pieces[0])
    wholes = inflight.regathered.get(key)
    if wholes is None:
        wholes = inflight.regathered[key] = gather_detached(
            saved.bucket, saved.layout, saved.pieces
        )
    whole = wholes[saved.index]
    return whole.as_strided(saved.size, saved.stride, whole.storage_offset() + saved.offset)
