"""Activation offload: the activations autograd saves go to host memory, and come back for backward.

`activation_offload()` adds an installer to the step's forward run (`step.forward_run`): while the
loss runs, `torch.autograd.graph.saved_tensors_hooks` are active (around the chosen modules'
calls, or the whole forward pass): each tensor autograd saves is
copied to the host when it is saved and copied back to its device when the backward pass needs
it (Composer's `activation_cpu_offload`, torch's `save_on_cpu`). On CUDA the host copies are in
pinned memory and both copies are `non_blocking` on the compute stream (ordered with the kernels
around them, so no synchronisation is needed; the host is free to run ahead). Not offloaded:
parameters (they are kept anyway), and, under `fsdp(reshard_after_forward=True)`, views of
gathered parameters, which stay handles that are gathered again (`parallel.reshard`).

On CPU the mechanism runs the same way (the saved tensors are copied and the copies used in the
backward pass), so it is tested for equality there; the memory it saves only shows on a GPU.

It composes with `activation_checkpointing`, in either composition order: the forward run
installs offload outside checkpointing (`step.forward_run.ORDER`), so a checkpointed module
saves nothing through these hooks (checkpoint's own hooks are innermost), and the others'
activations are offloaded.

Example:
    >>> step = functrain.compose(step, activation_offload(Block))      # the blocks' activations
    >>> step = functrain.compose(step, activation_offload())           # the whole forward pass
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .. import _torch
from ..parallel import reshard
from ..step import Algorithm, StepPieces
from ..step.forward_run import ForwardRun, Installer
from .activation_checkpointing import (
    StandIn,
    chosen_modules,
    module_matcher,
    parent_of,
    refuse_functorch,
)


class _Offloaded(StandIn):
    """Calls `inner` under the offloading hooks (outside any checkpointing stand-in)."""

    def __init__(self, inner: torch.nn.Module, pin_memory: bool, inflight=None):
        super().__init__(inner)
        object.__setattr__(self, "pin_memory", pin_memory)
        object.__setattr__(self, "inflight", inflight)  # the step's gathers at use (or None)

    def forward(self, *args, **kwargs):
        with offloading(self.pin_memory, self.inflight):
            return self.inner(*args, **kwargs)


def _pack(inflight, pin_memory: bool, tensor: torch.Tensor) -> Any:
    if inflight is not None:
        handle = reshard.pack_saved(inflight, tensor)
        if reshard.is_handle(handle):
            return ("handle", handle)
    if (
        type(tensor) is not torch.Tensor  # DTensor and other subclasses: left as they are
        or (tensor.is_leaf and tensor.requires_grad)  # a parameter: kept anyway
        or tensor.device.type == "meta"
    ):
        return ("kept", tensor)
    pin = pin_memory and tensor.device.type == "cuda"
    host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=pin)
    host.copy_(tensor, non_blocking=pin)
    return ("host", tensor.device, host)


def _unpack(inflight, packed: Any) -> torch.Tensor:
    kind = packed[0]
    if kind == "handle":
        return reshard.unpack_saved(inflight, packed[1])
    if kind == "kept":
        return packed[1]
    _, device, host = packed
    if device.type == "cpu":
        return host
    return host.to(device, non_blocking=host.is_pinned())


@contextlib.contextmanager
def offloading(pin_memory: bool = True, inflight=None) -> Iterator[None]:
    """While active, tensors autograd saves are kept on the host (see the module docstring);
    `inflight` (the forward run's `gathered_at_use`) turns views of gathered parameters into
    handles."""
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: _pack(inflight, pin_memory, t), lambda p: _unpack(inflight, p)
    ):
        yield


@contextlib.contextmanager
def offloading_modules(
    model: torch.nn.Module, names: list[str], pin_memory: bool = True, inflight=None
) -> Iterator[None]:
    """While active, the modules of `model` named in `names` run under `offloading`.

    Args:
        model: the root module.
        names: qualified module names (`chosen_modules`).
        pin_memory: page-locked host copies on CUDA.
        inflight: the step's gathers at use (`ForwardRun.gathered_at_use`), or None.
    """
    swapped = []
    try:
        for name in names:
            parent, child = parent_of(model, name)
            children = _torch.child_slots(parent)
            original = children[child]
            children[child] = _Offloaded(original, pin_memory, inflight)
            swapped.append((parent, child, original))
        yield
    finally:
        for parent, child, original in reversed(swapped):
            _torch.child_slots(parent)[child] = original


def activation_offload(
    target=None, *, names: str | Iterable[str] | None = None, pin_memory: bool = True
) -> Algorithm:
    """Keep saved activations in host memory between the forward and the backward pass.

    Args:
        target: the modules whose activations to offload (a class, class name, tuple, or
            `(name, module) -> bool`, as in `activation_checkpointing`); None with no `names`:
            the whole forward pass.
        names: fnmatch patterns of qualified module names.
        pin_memory: page-locked host copies on CUDA (faster, asynchronous copies).
    Returns:
        the `Algorithm` "activation_offload" (no state; exactly resumable).
    Example:
        >>> step = functrain.compose(step, activation_offload("Block"))
    """
    whole = target is None and names is None
    matches = None if whole else module_matcher(target, names)

    def install(run: ForwardRun) -> contextlib.AbstractContextManager[None]:
        if not torch.is_grad_enabled():
            return contextlib.nullcontext()
        refuse_functorch("activation_offload")
        if whole:
            return offloading(pin_memory, run.gathered_at_use)
        chosen = chosen_modules(run.model, matches)
        if not chosen:
            raise ValueError(
                f"activation_offload matched no module of {type(run.model).__name__}; check "
                "target/names"
            )
        return offloading_modules(run.model, chosen, pin_memory, run.gathered_at_use)

    installer = Installer("offload", install)

    def apply(pieces: StepPieces) -> StepPieces:
        return pieces._replace(installers=(*pieces.installers, installer))

    return Algorithm(name="activation_offload", apply=apply)
