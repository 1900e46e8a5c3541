"""Gather at use, free after use: FSDP's `reshard_after_forward` for functrain's step.

By default an FSDP step gathers every sharded parameter once, before the forward pass, and keeps
the whole tensors until the backward pass ends: the least communication, but each rank holds the
whole model during a step. With `fsdp(reshard_after_forward=True)` each module's parameters are
gathered when that module runs and freed when it returns, and gathered again in the backward pass
when autograd needs them, so a rank holds the whole parameters of about one module at a time:

    gather_params(leaves)        sharded params stay as their local pieces ("placeholders")
    with gathering_at_use():     a module's forward pre-hook swaps its placeholders for gathered
        loss = model(batch)      whole tensors; its forward hook swaps them back; tensors that
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
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from . import compute

# id(placeholder) -> (bucket, mesh, pieces, slot index): set by the latest `gather_params`.
_placeholders: dict[int, tuple] = {}
# storage address of a gathered whole -> (weakref to it, bucket, mesh, pieces, slot index)
_live: dict[int, tuple] = {}
# id(pieces[0]) -> the bucket's whole tensors gathered again in the backward pass
_regathered: dict[int, list[torch.Tensor]] = {}
# id(module) -> stack of [(attribute, placeholder)] to put back when the module returns
_restore: dict[int, list[list[tuple[str, torch.Tensor]]]] = {}


class _Saved(NamedTuple):
    """What autograd keeps instead of a view of a gathered parameter: how to rebuild it."""

    bucket: Any
    mesh: Any
    pieces: list
    index: int
    size: torch.Size
    stride: tuple[int, ...]
    offset: int  # storage offset relative to the whole tensor's


def register(bucket, mesh, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Make `pieces` (a bucket's local shards) the placeholders its modules will gather at use.

    Returns:
        `pieces`, to stand in for the whole tensors in the parameters given to the model.
    """
    for index, piece in enumerate(pieces):
        _placeholders[id(piece)] = (bucket, mesh, pieces, index)
    return pieces


def reset() -> None:
    """Forget the previous step's placeholders (called before registering new ones)."""
    _placeholders.clear()
    _live.clear()


def release(key: int) -> None:
    """Free a bucket gathered again in the backward pass (its gradients are being reduced)."""
    _regathered.pop(key, None)


def release_all() -> None:
    """Free everything gathered in the backward pass (when the pass ends)."""
    _regathered.clear()


@contextlib.contextmanager
def gathering_at_use() -> Iterator[None]:
    """While active, modules gather their placeholder parameters when called (see the module
    docstring). A no-op when there are no placeholders (no plan with reshard_after_forward)."""
    if not _placeholders:
        yield
        return
    pre = torch.nn.modules.module.register_module_forward_pre_hook(_before_module)
    post = torch.nn.modules.module.register_module_forward_hook(_after_module, always_call=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
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
        pre.remove()
        post.remove()
        _restore.clear()


def _before_module(module: torch.nn.Module, args: Any) -> None:
    found = [
        (name, _placeholders[id(value)])
        for name, value in module._parameters.items()
        if value is not None and id(value) in _placeholders
    ]
    if not found:
        _restore.setdefault(id(module), []).append([])
        return
    wholes: dict[int, list[torch.Tensor]] = {}
    for _, (bucket, mesh, pieces, _) in found:
        key = id(pieces[0])
        if key not in wholes:
            wholes[key] = _gather(bucket, mesh, pieces)
    swapped = []
    for name, (_, _, pieces, index) in found:
        swapped.append((name, module._parameters[name]))
        module._parameters[name] = wholes[id(pieces[0])][index]
    _restore.setdefault(id(module), []).append(swapped)


def _after_module(module: torch.nn.Module, args: Any, output: Any) -> None:
    stack = _restore.get(id(module))
    if stack:
        for name, placeholder in stack.pop():
            module._parameters[name] = placeholder


def _gather(bucket, mesh, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """The bucket's whole tensors: differentiable (gradients reduce-scattered) under autograd."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in pieces):
        with torch.no_grad():
            prefetched = compute._prefetch(bucket, mesh, pieces)
        wholes = list(compute._BucketCollective.apply(bucket, mesh, prefetched, *pieces))
    else:
        wholes = _gather_detached(bucket, mesh, pieces)
    for index, whole in enumerate(wholes):
        _live[whole.untyped_storage().data_ptr()] = (
            weakref.ref(whole),
            bucket,
            mesh,
            pieces,
            index,
        )
    return wholes


def _gather_detached(bucket, mesh, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """The bucket's whole tensors, outside autograd (evaluation, and again in backward)."""
    with torch.no_grad():
        prefetched = compute._prefetch(bucket, mesh, pieces)
        return compute._gather_bucket(bucket, pieces, prefetched)


def _pack(tensor: torch.Tensor) -> Any:
    if type(tensor) is not torch.Tensor or tensor.device.type == "meta":
        return tensor
    address = tensor.untyped_storage().data_ptr()
    entry = _live.get(address)
    if entry is None:
        return tensor
    ref, bucket, mesh, pieces, index = entry
    whole = ref()
    if whole is None or whole.untyped_storage().data_ptr() != address:
        return tensor  # a freed whole's address, reused by an unrelated tensor
    return _Saved(
        bucket,
        mesh,
        pieces,
        index,
        tensor.size(),
        tensor.stride(),
        tensor.storage_offset() - whole.storage_offset(),
    )


def _unpack(saved: Any) -> torch.Tensor:
    if not isinstance(saved, _Saved):
        return saved
    key = id(saved.pieces[0])
    wholes = _regathered.get(key)
    if wholes is None:
        wholes = _regathered[key] = _gather_detached(saved.bucket, saved.mesh, saved.pieces)
    whole = wholes[saved.index]
    return whole.as_strided(saved.size, saved.stride, whole.storage_offset() + saved.offset)
