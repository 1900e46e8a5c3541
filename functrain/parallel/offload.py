"""Parameter and optimizer-state offload: FSDP's shards live in host memory between steps.

`fsdp(offload=True)` (Composer's `cpu_offload`, FSDP2's `CPUOffloadPolicy`) records in every
parameter's `ParamPolicy` that its shard lives on the host. Then:

    init                 each rank's shards are placed in host memory (pinned on CUDA); the
                         optimizer state, built from them, is on the host too
    step: to_compute     the shards are copied to the compute device (non_blocking from pinned
                         memory) and gathered there as without offload
          backward       gradients are reduce-scattered on the device, as without offload
          grads_to_host  once the reductions have finished, the gradient shards are copied to
                         (pinned) host memory and the device copies are dropped
          update         clipping, the guard and the optimizer run on the host shards, so the
                         optimizer state never visits the device

So the device holds, between steps, nothing of the parameters or the optimizer state; during a
step, the shards' copies, the gathered parameters (as without offload) and the gradients until
they are reduced. The cost is two host-device copies of the shards per step and an optimizer
update at host speed.

Host DTensors keep the mesh (a CUDA mesh) while their local piece is on the CPU, as in FSDP2:
they are built with `dtensor_like`, since `DTensor.from_local` would move the piece to the
mesh's device. On a CPU-only machine the compute device *is* the host, but the copies are still
made (into other tensors), so the path runs and is tested; it saves nothing there. Each copy is
counted in `parallel.COUNTER` ("host_to_device", "device_to_host" payload bytes; no network
bytes).

Example:
    >>> state = functrain.init(model, opt, mesh=mesh, plan=fsdp(offload=True))
    >>> state.layout.policy("fc.weight").offload, state.params["fc.weight"].to_local().device
    (True, device(type='cpu'))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import _torch
from .comm import COUNTER

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

    from .layout import Layout


def compute_device(mesh) -> torch.device:
    """The device a mesh computes on: this process's CUDA device, or the mesh's device type."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def pins(mesh) -> bool:
    """True when host copies for `mesh` should be pinned (page-locked): a CUDA mesh."""
    return mesh.device_type == "cuda" and torch.cuda.is_available()


def host_copy(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    """A new host tensor equal to `tensor` (pinned when `pin`); waits for nothing.

    A copy from a device into pinned memory is asynchronous: the caller synchronises (see
    `grads_to_host`) before the host reads it.
    """
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
    host.copy_(tensor, non_blocking=pin and tensor.device.type != "cpu")
    return host


def dtensor_like(local: torch.Tensor, like: Any) -> DTensor:
    """A DTensor placed like `like` (a DTensor) whose piece on this rank is `local`, on
    `local`'s device (a host piece of a CUDA mesh stays on the host; see `dtensor_on`)."""
    return dtensor_on(local, like.device_mesh, like.placements, like.shape, like.stride())


def dtensor_on(local: torch.Tensor, mesh, placements, shape, stride) -> DTensor:
    """A DTensor of global `shape`/`stride` on `mesh` with `placements`, whose piece on this
    rank is `local`, kept on `local`'s device.

    Not differentiable (the result requires grad when `local` does). A piece on the mesh's
    device goes through `DTensor.from_local`, as everywhere else; a host piece of a CUDA mesh
    is wrapped directly, as FSDP2 does, since `from_local` would move it to the device.
    """
    from torch.distributed.tensor import DTensor

    if local.device.type == mesh.device_type or local.is_meta:
        return DTensor.from_local(
            local, mesh, placements, run_check=False, shape=shape, stride=stride
        )
    return _torch.dtensor_from_spec(local, mesh, placements, shape, stride)


def _offloaded_dtensors(tree: dict[str, Any], layout: Layout):
    from torch.distributed.tensor import DTensor

    for name, value in tree.items():
        if isinstance(value, DTensor):
            policy = layout.policy(name)
            if policy.offload:
                yield name, value, policy


def to_compute(params: dict[str, Any], layout: Layout | None) -> dict[str, Any]:
    """`params` with each offloaded shard copied to the compute device (identity otherwise).

    The copies are new tensors that do not require grad (the step makes its leaves from them);
    on CUDA they are `non_blocking` copies from pinned memory, ordered on the current stream.

    Args:
        params: `{name: Tensor | DTensor}` (the state's, or a subset).
        layout: their layout (`state.layout`).
    Returns:
        `{name: tensor}` in the same order; the host tensors are left as they are.
    """
    if layout is None or not layout.offloaded:
        return params  # the same object: nothing to copy
    device = compute_device(layout.mesh)
    out = dict(params)
    for name, value, _ in _offloaded_dtensors(params, layout):
        local = _torch.local_tensor(value)
        piece = torch.empty(local.shape, dtype=local.dtype, device=device)
        piece.copy_(local.detach(), non_blocking=local.is_pinned())
        COUNTER.record("host_to_device", local.numel() * local.element_size(), 1)
        out[name] = dtensor_like(piece, value)
    return out


def grads_to_host(grads: dict[str, Any], layout: Layout | None) -> dict[str, Any]:
    """Offloaded parameters' gradient shards copied to host memory (identity otherwise).

    Call it after `finalize_grads`, which finishes every reduction still in flight: a reduced
    gradient is only complete then. On CUDA the copies go into pinned memory without blocking
    and one synchronisation of the current stream ends them, so the host update reads them
    complete.

    Args:
        grads: `{name: gradient}` placed like the parameters (on the compute device).
        layout: the parameters' layout.
    Returns:
        `{name: gradient}`, host DTensors for the offloaded parameters.
    """
    if layout is None or not layout.offloaded:
        return grads
    pinnable = pins(layout.mesh)
    out = dict(grads)
    waits = False
    for name, grad, policy in _offloaded_dtensors(grads, layout):
        local = _torch.local_tensor(grad).detach()
        pin = pinnable and policy.pin_memory
        host = host_copy(local, pin)
        waits = waits or (pin and local.device.type == "cuda")
        COUNTER.record("device_to_host", local.numel() * local.element_size(), 1)
        out[name] = dtensor_like(host, grad)
    if waits:
        torch.cuda.current_stream().synchronize()
    return out


def place_on_host(piece: torch.Tensor, mesh, pin_memory: bool) -> torch.Tensor:
    """A rank's shard moved to host memory for an offloaded parameter (at `init`)."""
    return host_copy(piece.detach(), pin_memory and pins(mesh))
