"""Placing a model's parameters on the mesh by a plan: `shard_params` (called by `functrain.init`).

`shard_params(model, params, mesh=mesh, plan=plan)` turns the model's parameters into DTensors
and *puts those same DTensors back into the model*, as FSDP2 does: no rank keeps a full copy of a
sharded parameter, and the state's tensors are the model's. It returns them with their `Layout`
(policies, buckets, tensor-parallel styles), which `init` keeps in `state.layout`.

A model built on the meta device (`with torch.device("meta"): model = Net()`) is materialised one
module at a time, each with its own seed (`reset_parameters()` under a generator derived from the
run's seed and the module's name), so no rank ever holds the whole model and the initial values do
not depend on the mesh.

Example:
    >>> mesh = functrain.parallel.init_mesh(dp_shard=-1)
    >>> params, layout = shard_params(model, dict(model.named_parameters()), mesh=mesh,
    ...                               plan="fsdp")
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from .. import _torch
from ..rng import RngState, seed_for, seeded_global_rng
from . import comm, offload, tensor_parallel
from .flat import shard_extent
from .layout import Layout, make_layout
from .mesh import check_mesh, dim_size
from .plans import Plan, resolve_plan


def param_placements(
    name: str, shape: tuple[int, ...], tp_style: str | None, attr: str, mesh, plan: Plan
) -> tuple:
    """The placements of one parameter on the 3-D mesh.

    Args:
        name: its name (for messages).
        shape: its global shape.
        tp_style: the style of the Linear that owns it (None: not tensor-parallel).
        attr: its attribute name in that module ("weight", "bias").
        mesh: the mesh.
        plan: the plan.
    Returns:
        `(dp_replicate, dp_shard, tp)` placements.
    """
    tp_place: Placement = Replicate()
    if tp_style is not None and dim_size(mesh, "tp") > 1:
        tp_place = tensor_parallel.tp_placement(tp_style, attr)
    shard_place: Placement = Replicate()
    if plan.shard and len(shape) > 0 and dim_size(mesh, "dp_shard") > 1:
        tp_dim = tp_place.dim if isinstance(tp_place, Shard) else None
        free = [d for d in range(len(shape)) if d != tp_dim]  # never cut one dim twice
        if free:
            shard_place = Shard(free[0])
    return (Replicate(), shard_place, tp_place)


def local_piece(tensor: torch.Tensor, mesh, placements: tuple) -> torch.Tensor:
    """This rank's piece of the full `tensor` under `placements` (a view; DTensor's chunking)."""
    piece = tensor
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            n = mesh.size(mesh_dim)
            length, start = shard_extent(
                tensor.shape[placement.dim], n, mesh.get_local_rank(mesh_dim)
            )
            piece = piece.narrow(placement.dim, start, length)
    return piece


def _owners(model: torch.nn.Module) -> dict[str, list[tuple[torch.nn.Module, str, str]]]:
    """`{param name (the first, as named_parameters gives it): [(module, attr, module name), ...]}`."""
    first: dict[int, str] = {}
    owners: dict[str, list] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for attr, param in _torch.parameter_slots(module).items():
            if param is None:
                continue
            full = f"{module_name}.{attr}" if module_name else attr
            key = first.setdefault(id(param), full)
            entries = owners.setdefault(key, [])
            if not any(m is module and a == attr for m, a, _ in entries):
                entries.append((module, attr, module_name))
    return owners


def _broadcast_from_rank0(tensors: list[torch.Tensor], cap_bytes: int = 64 << 20) -> None:
    """Make every rank's `tensors` equal to rank 0's (as DDP does at construction), in flat chunks."""
    if comm.group_size(None) == 1:
        return
    ordered = sorted(tensors, key=lambda t: str(t.dtype))  # same order on every rank
    for chunk in _chunks(ordered, cap_bytes):
        flat = torch.cat([t.reshape(-1) for t in chunk])
        comm.broadcast_(flat, 0, None)
        with torch.no_grad():
            for t, part in zip(chunk, flat.split([t.numel() for t in chunk])):
                t.copy_(part.view(t.shape))


def _chunks(tensors: list[torch.Tensor], cap_bytes: int) -> Iterator[list[torch.Tensor]]:
    chunk: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if chunk and (size + nbytes > cap_bytes or t.dtype != chunk[0].dtype):
            yield chunk
            chunk, size = [], 0
        chunk.append(t)
        size += nbytes
    if chunk:
        yield chunk


def _materialize(module: torch.nn.Module, module_name: str, device, seed: int) -> None:
    """Give a meta module's own parameters and buffers real values (its `reset_parameters`)."""
    for attr, param in _torch.parameter_slots(
        module
    ).items():  # tied and already placed: re-made here
        if isinstance(param, DTensor):
            _torch.parameter_slots(module)[attr] = torch.nn.Parameter(
                torch.empty(param.shape, dtype=param.dtype, device="meta"), param.requires_grad
            )
    module.to_empty(device=device, recurse=False)
    reset = getattr(module, "reset_parameters", None) or getattr(
        module, "reset_running_stats", None
    )
    if reset is None:  # to_empty left garbage: refuse rather than train on it
        raise ValueError(
            f"module {module_name or '<root>'} ({type(module).__name__}) has parameters or buffers "
            "on the meta device but no reset_parameters(); define one that (re)computes its own "
            "parameters and buffers, or build the model on a real device"
        )
    with seeded_global_rng(seed_for(RngState(seed), 0, f"init/{module_name}"), device.type):
        with torch.no_grad():
            reset()


def _is_meta(t) -> bool:
    return t is not None and t.is_meta and not isinstance(t, DTensor)


def shard_params(
    model: torch.nn.Module,
    params: dict[str, torch.Tensor],
    *,
    mesh,
    plan: str | Plan | None = None,
    seed: int | None = None,
) -> tuple[dict[str, torch.Tensor], Layout]:
    """Place `params` (the model's, by name) on `mesh` per `plan`; return them and their layout.

    The model's parameters are replaced by the same DTensors (sharded ones are never held whole),
    and every rank ends with rank 0's values (broadcast, as DDP does) unless the model was on the
    meta device, where each module is initialised from `seed` and its name. Nothing else is
    left on the model: its tensor-parallel forwards and the input cast of mixed precision come
    from the returned layout while a step runs it (see `parallel.running`).

    Args:
        model: the module the params belong to.
        params: `{name: tensor}` as `functrain.init` collects them (tied weights once).
        mesh: a mesh from `functrain.parallel.init_mesh`.
        plan: a plan name or `Plan` (None: "ddp").
        seed: the run's seed, for meta-device initialisation (None: 0).
    Returns:
        `({name: DTensor} in the order of `params`, the Layout)`.
    Example:
        >>> params, layout = shard_params(model, dict(model.named_parameters()), mesh=mesh,
        ...                               plan="fsdp")
    """
    if mesh is None:
        raise ValueError(f"plan={plan!r} needs a mesh: pass mesh=functrain.parallel.init_mesh(...)")
    check_mesh(mesh)
    plan = resolve_plan(plan)
    tp_size = dim_size(mesh, "tp")
    if tp_size > 1 and plan.tp is None:
        raise ValueError(
            f"the mesh has tp={tp_size} but plan {plan.name!r} has no tensor parallelism; use "
            "plan='tp' or 'tp+fsdp', or make the mesh with tp=1"
        )
    owners = _owners(model)
    missing = [name for name in params if name not in owners]
    if missing:
        raise ValueError(f"params {missing} are not parameters of the model (names must match)")
    modules = dict(model.named_modules())
    styles = tensor_parallel.resolve_tp_styles(model, plan.tp) if plan.tp is not None else {}
    for module_name, style in styles.items():
        tensor_parallel.check_style(module_name, modules[module_name], style, tp_size)
    for name, entries in owners.items():
        if len(entries) > 1 and any(m in styles for _, _, m in entries):
            raise ValueError(
                f"{name} is tied to {[m + '.' + a for _, a, m in entries[1:]]} and cannot be "
                "tensor-parallel; leave its Linear out of the tp plan"
            )

    device = offload.compute_device(mesh)
    name_of = {(id(m), a): name for name, entries in owners.items() for m, a, _ in entries}
    result: dict[str, DTensor] = {}

    def place(name: str, whole: torch.Tensor) -> None:
        module, attr, module_name = owners[name][0]
        requires_grad = _torch.parameter_slots(module)[attr].requires_grad
        placements = param_placements(
            name, tuple(whole.shape), styles.get(module_name), attr, mesh, plan
        )
        piece = local_piece(whole.detach(), mesh, placements)
        if plan.offload:  # own host storage (pinned on CUDA): the optimizer updates it there
            piece = offload.place_on_host(piece, mesh, plan.pin_memory)
        else:
            piece = piece.to(device)
            if any(isinstance(p, Shard) for p in placements):
                piece = piece.clone()  # own storage, so the whole tensor can be freed
        value = offload.dtensor_on(
            piece, mesh, placements, whole.shape, _contiguous_stride(whole.shape)
        )
        result[name] = value
        new_param = torch.nn.Parameter(value, requires_grad=requires_grad)
        for owner, owner_attr, _ in owners[name]:
            _torch.parameter_slots(owner)[owner_attr] = new_param

    # Meta modules: one at a time, so at most one module is ever whole on a rank.
    seed = 0 if seed is None else int(seed)
    for module_name, module in model.named_modules():
        own = list(_torch.parameter_slots(module).values()) + list(
            _torch.buffer_slots(module).values()
        )
        if not any(_is_meta(t) for t in own):
            continue
        _materialize(module, module_name, device, seed)
        for attr, param in list(_torch.parameter_slots(module).items()):
            if param is not None and name_of[(id(module), attr)] in params:
                place(name_of[(id(module), attr)], param)
    real = {
        name: getattr(owners[name][0][0], owners[name][0][1])
        for name in params
        if name not in result
    }
    _broadcast_from_rank0([t.data for t in real.values() if not isinstance(t, DTensor)])
    for name, tensor in real.items():
        place(name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor)
    placed = {name: result[name] for name in params}
    trainable = frozenset(
        name
        for name in params
        if _torch.parameter_slots(owners[name][0][0])[owners[name][0][1]].requires_grad
    )
    layout = make_layout(mesh, plan, placed, trainable=trainable, tp_styles=styles)
    tensors: dict[str, torch.Tensor] = dict(placed)
    return tensors, layout


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(tuple(shape)):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))
