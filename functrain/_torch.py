"""Torch's private API in one place: every private torch name functrain uses, and why.

Outside this module functrain uses torch's public API only (`tests/test_torch_private.py` greps
the package for private names). When a torch release renames or removes one of these, this is
the one file to change; `python -m bench torch-versions` runs the core tests on the oldest
declared torch and the newest. Each section names its users and why no public API serves.

Sections:
    lists of tensors      `torch._foreach_*`                      step, parallel, functional, optim
    fused optimizers      `torch._fused_adam_/_adamw_/_sgd_`,      optim
                          `torch._C._storage_Use_Count`
    DTensor internals     `DTensor._local_tensor`, `DTensorSpec`,  parallel, step, checkpoint, optim
                          `compute_local_shape_and_global_offset`
    module internals      `Module._parameters/_buffers/_modules`,  step, parallel, algorithms
                          `Module._forward_pre_hooks`
    autograd engine       `torch._C._current_graph_task_id`,       parallel, callbacks, algorithms
                          `_execution_engine.queue_callback`, functorch's interpreter
                          stack, whether `torch._dynamo` is loaded
    pytrees               `torch.utils._pytree` registration       state
    aten kernels          `aten._scaled_dot_product_*_attention`   algorithms
    device meshes         `DeviceMesh._flatten`, `_pg_registry`    parallel
    torch bugs            `torch.distributed.nn.functional` binds  parallel (teardown),
                          `group.WORLD` as a default argument;     checkpoint
                          `ProcessGroup._get_backend`, `_world.pg_map`
    torch releases        `distribute_tensor(src_data_rank=)`,     tests, parallel (teardown)
                          gloo's worker thread names

Example:
    >>> from functrain import _torch
    >>> _torch.foreach_add([torch.ones(2)], [torch.ones(2)])
    [tensor([2., 2.])]
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import torch

# --- lists of tensors (step, parallel, functional, optim) ----------------------------------
# Why private: `torch._foreach_*` run one kernel (launch) over a list of tensors; the public
# per-tensor ops cost one launch and one Python dispatch per tensor, which the step pays per
# parameter per step. torch's own optimizers use them (torch/optim/_functional); no public API.


def foreach(op: str, inplace: bool = False) -> Callable[..., Any]:
    """`torch._foreach_<op>` (`torch._foreach_<op>_` when `inplace`).

    Args:
        op: the op without prefix: "mul", "add", "lerp", "copy" (with `inplace`), ...
        inplace: the variant writing into its first argument.
    Returns:
        the torch function.
    Example:
        >>> foreach("mul")([torch.ones(2)], 2.0)
        [tensor([2., 2.])]
    """
    name = f"_foreach_{op}_" if inplace else f"_foreach_{op}"
    found = getattr(torch, name, None)
    if found is not None:
        return found
    # An op this torch has no foreach kernel for (torch 2.6 lacks `_foreach_clone`): the same
    # arithmetic one tensor at a time, through the public per-tensor op.
    single = getattr(torch.Tensor, f"{op}_" if inplace else op, None)
    if single is None:
        raise NotImplementedError(
            f"torch {torch.__version__} has neither torch.{name} nor Tensor.{op}; functrain "
            "needs a newer torch (see pyproject.toml's declared range)"
        )

    def per_tensor(xs: list[torch.Tensor], *args: Any) -> list[torch.Tensor] | None:
        out = [
            single(x, *(a[i] if isinstance(a, (list, tuple)) else a for a in args))
            for i, x in enumerate(xs)
        ]
        return None if inplace else out

    return per_tensor


def foreach_copy_(dests: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """Copy each of `srcs` into the matching tensor of `dests` (one kernel)."""
    torch._foreach_copy_(dests, srcs)


def foreach_add(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
    """`[x + y for x, y in zip(xs, ys)]` in one kernel."""
    return list(torch._foreach_add(xs, ys))


def foreach_mul(xs: list[torch.Tensor], scalar: Any) -> list[torch.Tensor]:
    """`[x * scalar for x in xs]` in one kernel (`scalar`: a number or a 0-d tensor)."""
    return list(torch._foreach_mul(xs, scalar))


def foreach_div(xs: list[torch.Tensor], scalar: Any) -> list[torch.Tensor]:
    """`[x / scalar for x in xs]` in one kernel."""
    return list(torch._foreach_div(xs, scalar))


def foreach_lerp(xs: list[torch.Tensor], ys: list[torch.Tensor], weight: Any) -> list:
    """`[x + weight * (y - x) ...]` in one kernel."""
    return list(torch._foreach_lerp(xs, ys, weight))


def foreach_norm(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The 2-norm of each tensor of `xs` (0-d tensors), in one kernel."""
    return list(torch._foreach_norm(xs))


def foreach_clone(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `xs`. `torch._foreach_clone` is missing from torch 2.6: there, one clone each."""
    return list(foreach("clone")(xs))


# --- fused optimizer kernels (optim) -------------------------------------------------------
# Why private: the single-kernel Adam/AdamW/SGD updates torch.optim uses with `fused=True`;
# torch.optim's public classes hold state in a stateful object, functrain's optimizers are pure
# functions over their own state, so they call the kernels torch.optim calls.


def fused_optimizer_kernel(name: str) -> Callable[..., Any] | None:
    """`torch._fused_<name>_` ("adam", "adamw", "sgd"), or None where this torch lacks it."""
    return getattr(torch, f"_fused_{name}_", None)


def storage_use_counter() -> Callable[[int], int]:
    """`count(storage._cdata)`: how many tensors share a storage (`tensor.untyped_storage()`; a
    donated buffer no one else holds is 1). The C function itself, no wrapper around it: the
    buffer pool calls it for every tensor of a pure step's state, every step. `_cdata` is a raw
    address: the caller holds the storage object while it counts.

    Why private: no public API tells whether a storage is shared; `torch._C._storage_Use_Count`
    is what torch's own `swap_tensors` checks.
    Example: `s = torch.ones(2).untyped_storage(); storage_use_counter()(s._cdata)` is 1.
    """
    return torch._C._storage_Use_Count


# --- DTensor internals (parallel, step, checkpoint, optim) --------------------------------
# Why private: `DTensor.to_local()` is an autograd op (a view with a backward, and a graph node
# per call); the step reads a DTensor's local piece outside autograd, per parameter per step,
# and writes into it in place. Building a DTensor from an existing local piece without a
# device check (offload keeps host shards of a mesh on the accelerator) needs its spec.


def local_tensor(dtensor: Any) -> torch.Tensor:
    """A DTensor's local piece (sharing its storage, no autograd node)."""
    return dtensor._local_tensor


def dtensor_from_spec(local: torch.Tensor, mesh: Any, placements, shape, stride) -> Any:
    """A DTensor over `local` on `mesh`, wherever `local` lives (no device check, no copy)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    meta = TensorMeta(torch.Size(shape), tuple(stride), local.dtype)
    spec = DTensorSpec(mesh, tuple(placements), tensor_meta=meta)
    return DTensor(local, spec, requires_grad=local.requires_grad)


def local_shape_and_offset(shape, mesh: Any, placements) -> tuple[tuple, tuple]:
    """`(local shape, global offset)` of this rank's piece of a tensor of `shape` placed so.
    Why private: the public `DTensor` answers it only for an existing tensor; a checkpoint
    reader needs it before the tensor exists."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return compute_local_shape_and_global_offset(shape, mesh, placements)


# --- module internals (step, parallel, algorithms) -----------------------------------------
# Why private: for the length of one forward, functrain puts tensors that are not Parameters
# (gathered shards, the state's tensors) into a module's parameter slots and swaps children for
# stand-ins. `setattr` refuses a plain tensor over a registered parameter and runs per-call
# checks; `torch.func.functional_call` does the same swap with the same dicts, at a per-call
# cost the step avoids. No public API reads a module's own (non-recursive) hooks.


def parameter_slots(module: torch.nn.Module) -> dict[str, Any]:
    """`module`'s own parameters, by attribute name: the dict itself (writable)."""
    return module._parameters


def buffer_slots(module: torch.nn.Module) -> dict[str, Any]:
    """`module`'s own buffers, by attribute name: the dict itself (writable)."""
    return module._buffers


def child_slots(module: torch.nn.Module) -> dict[str, Any]:
    """`module`'s direct children, by attribute name: the dict itself (writable)."""
    return module._modules


def forward_pre_hooks(module: torch.nn.Module) -> list[Any]:
    """The forward pre-hooks registered on `module` itself, oldest first."""
    return list(module._forward_pre_hooks.values())


# --- autograd engine (parallel, callbacks, algorithms) -------------------------------------
# Why private: a reduction launched inside the backward pass must be finished when that pass
# ends; only the engine's queue runs a callback then (DDP uses the same). No public API tells
# whether a backward pass, a torch.func transform or the compiler is running (or loaded).


def in_backward_pass() -> bool:
    """True while autograd's engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run `callback` when the running backward pass ends (call inside one)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def functorch_transforms_active() -> bool:
    """True inside a `torch.func` transform (`grad`, `vmap`, ...)."""
    return bool(torch._C._are_functorch_transforms_active())


def under_functorch_grad() -> bool:
    """True when a `torch.func` interpreter is on the stack (its grad has no saved-tensor hooks)."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def dynamo_loaded() -> bool:
    """Whether torch's compiler is imported (asking `torch.compiler` would import it: seconds)."""
    return "torch._dynamo" in sys.modules


# --- pytrees (state) -----------------------------------------------------------------------
# Why private: `torch.func.vmap` flattens its arguments with `torch.utils._pytree`'s registry,
# and a type joins it only through that module (no public `torch.utils.pytree` on 2.13).


def register_torch_pytree(cls: type, flatten, unflatten, flatten_with_keys) -> None:
    """Register `cls` with torch's pytree, so `torch.func` transforms see into it.

    `flatten_with_keys(obj)` returns `([(dotted_path, child), ...], context)`; the paths become
    torch's `MappingKey`s.
    """

    def with_keys(obj):
        keyed, context = flatten_with_keys(obj)
        return [(torch.utils._pytree.MappingKey(k), x) for k, x in keyed], context

    torch.utils._pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=with_keys,
    )


# --- aten kernels (algorithms) -------------------------------------------------------------
# Why private: selective activation checkpointing keeps the outputs of the attention kernels
# that `scaled_dot_product_attention` dispatches to; those kernels are aten ops whose names
# start with an underscore (torchtitan's policy names the same ones). No public list exists.

_ATTENTION_KERNELS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


def attention_kernel_ops() -> frozenset:
    """The aten overloads `scaled_dot_product_attention` runs as (those this torch has)."""
    aten = torch.ops.aten
    return frozenset(
        getattr(aten, name).default for name in _ATTENTION_KERNELS if hasattr(aten, name)
    )


# --- device meshes (parallel) --------------------------------------------------------------
# Why private: one process group over two mesh dims (HSDP's data-parallel group) has no public
# constructor but `DeviceMesh._flatten` (torchtitan uses it); a mesh keeps its groups in
# `_pg_registry`, which teardown empties so the destroyed groups' destructors run at once.


def flatten_mesh(mesh: Any, name: str) -> Any:
    """`mesh`'s dims flattened into one dim called `name` (cached by torch on the root mesh)."""
    return mesh._flatten(name)


def release_mesh_groups(mesh: Any) -> None:
    """Drop `mesh`'s references to its process groups (the mesh is unusable afterwards)."""
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()


# --- torch bugs worked around (parallel, checkpoint) -----------------------------------------
# `torch.distributed.nn.functional` declares `def broadcast(tensor, src, group=group.WORLD)`
# and so on (torch/distributed/nn/functional.py): `group.WORLD` is evaluated when the module is
# imported. Imported after `init_process_group` (DTensor's constructor imports it through
# torch._dynamo), each default is the default process group object itself, which then can never
# be freed: its gloo worker threads outlive `destroy_process_group` into interpreter exit, where
# one can abort the process. The defaults date from https://github.com/pytorch/pytorch/pull/40762
# (unchanged on main; `tests/test_torch_private.py::test_world_default_still_bound`).

WORLD_DEFAULTS_MODULE = "torch.distributed.nn.functional"


def world_group_defaults() -> list[str]:
    """Names of `torch.distributed.nn.functional`'s functions whose defaults hold a group."""
    module = sys.modules.get(WORLD_DEFAULTS_MODULE)
    if module is None:
        return []
    from torch.distributed import ProcessGroup

    return [
        name
        for name, value in vars(module).items()
        if any(ProcessGroup in type(d).__mro__ for d in getattr(value, "__defaults__", None) or ())
    ]


def release_world_defaults() -> None:
    """Set the process-group defaults of `torch.distributed.nn.functional` back to None (the
    default group, looked up at call time), once the groups are destroyed."""
    module = sys.modules.get(WORLD_DEFAULTS_MODULE)
    if module is None:
        return
    from torch.distributed import ProcessGroup

    for name in world_group_defaults():
        value = getattr(module, name)
        value.__defaults__ = tuple(
            None if ProcessGroup in type(d).__mro__ else d for d in value.__defaults__
        )


# Before torch 2.8 (https://github.com/pytorch/pytorch/pull/154976) a `ProcessGroup`'s binding
# keeps the GIL in its destructor, which destroys its gloo backend, which takes the mutex a gloo
# worker holds while it frees its last collective's tensors, which needs the GIL: deadlock (2.6).
# The backend's binding releases the GIL: hold the backends while the groups go, then drop them.


def live_groups() -> list[Any]:
    """Every process group torch has made and not destroyed (the default group included)."""
    return list(torch.distributed.distributed_c10d._world.pg_map)


def group_backends(groups: list[Any]) -> list[Any]:
    """The backends of `groups`: held, no group's destructor destroys them; clearing the list
    once the groups are gone destroys them with the GIL released. Example:
        >>> held = group_backends([g]); dist.destroy_process_group(g); del g; held.clear()
    """
    return [group._get_backend(device) for group in groups for device in group._device_types]


# --- differences between torch releases (tests, parallel) ----------------------------------
# Public behaviour that changed inside the declared range (oldest: 2.6; docs/torch_versions.md
# lists the releases the core tests ran on). Each answer is the same on every release.


def distribute_from_every_rank(tensor: torch.Tensor, mesh: Any, placements) -> Any:
    """`tensor` (whole, the same on every rank of `mesh`) as a DTensor with `placements`: each
    rank keeps its own piece of its own copy, with no communication (`distribute_tensor(...,
    src_data_rank=None)` from torch 2.7; torch 2.6 always scatters rank 0's copy, which gloo
    cannot do for float8: there, each rank cuts its piece itself). Returns the DTensor.
    Example: `w = distribute_from_every_rank(torch.ones(4, 2), mesh, [Shard(0)])`.
    """
    from torch.distributed.tensor import distribute_tensor

    if "src_data_rank" in inspect.signature(distribute_tensor).parameters:
        return distribute_tensor(tensor, mesh, placements, src_data_rank=None)
    return cut_from_every_rank(tensor, mesh, placements)


def cut_from_every_rank(tensor: torch.Tensor, mesh: Any, placements) -> Any:
    """`distribute_from_every_rank` on any torch: this rank's piece, cut and wrapped."""
    from torch.distributed.tensor import DTensor

    shape, offset = local_shape_and_offset(tensor.shape, mesh, placements)
    piece = tensor.detach()[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
    local = piece.clone(memory_format=torch.contiguous_format)  # its own storage, as scattered
    out = DTensor.from_local(
        local, mesh, placements, run_check=False, shape=tensor.shape, stride=tensor.stride()
    )
    return out.requires_grad_(tensor.requires_grad)


def gloo_worker_thread_name() -> str | None:
    """The name torch gives each gloo worker thread, or None where it leaves them unnamed.

    Unnamed, they carry the process's name. torch names them since
    https://github.com/pytorch/pytorch/pull/169979 (December 2025); measured: 2.6.0 unnamed,
    2.13.0 and 2.14.1 named, the releases between not claimed (None: "cannot tell").
    Example: `gloo_worker_thread_name()` is 'pt_gloo_runloop' on torch 2.13.
    """
    major, minor = (int(n) for n in re.findall(r"\d+", torch.__version__)[:2])
    return "pt_gloo_runloop" if (major, minor) >= (2, 13) else None
