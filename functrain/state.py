"""`TrainState`: everything a run is, as one frozen pytree, and `init` to build it from a model.

Only tensors and plain scalars are leaves, so every part of the state saves and loads by its path
(`params.fc.weight`, `opt_state.1.mu.fc.weight`, `timestamp.batch`, ...). The state's `layout`
(how its parameters sit on a device mesh) is static metadata of the tree, not a leaf.

For `torch.func` (which flattens with torch's own pytree) a state's tensors are its children and
its Python numbers (step, rng, timestamp, optimizer counts) static context, like the layout: so
`torch.func.vmap(step, in_dims=(0, None))` maps over a state stacked by `functrain.stack_states`
while the counters stay Python numbers, read without a device sync, and saved by path as before.

Example:
    >>> model = torch.nn.Linear(3, 2)
    >>> state = functrain.init(model, functrain.optim.adamw(lr=1e-3), seed=0)
    >>> sorted(state.params)
    ['bias', 'weight']
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from . import _torch
from .rng import RngState
from .tree import (
    fast_replace,
    leaves_with_paths,
    register_dataclass,
    static_field,
    tree_flatten,
    tree_unflatten,
)
from .units import Timestamp


@register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """The whole training state.

    Attributes:
        step: number of optimizer steps taken.
        params: `{fqn: tensor}` from `named_parameters()` (tied weights once, under their first
            name). Tensors or DTensors.
        buffers: `{fqn: tensor}` from `named_buffers()` (BatchNorm statistics, ...).
        opt_state: the optimizer's state pytree (per-transform NamedTuples).
        rng: the run's `RngState`; all randomness derives from it.
        algo_state: `{algorithm name: pytree}` for EMA weights, SWA averages, loss scale, ...
        timestamp: the epoch/batch/sample/token counters and the run's horizon.
        extra: `{name: pytree}` for anything else that must checkpoint (callback state, the data
            position); plain scalars and tensors only.
        layout: the `functrain.parallel.Layout` of the params (mesh, per-parameter policies,
            buckets, data-parallel coordinates) or None (one process, no sharding). Static: not
            a leaf, so `tree_map`, `replace` and loading into a `like` state keep it, and no
            checkpoint stores it.
    """

    step: int
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    opt_state: Any
    rng: RngState
    algo_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    timestamp: Timestamp = dataclasses.field(default_factory=Timestamp)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    layout: Any = static_field(None)

    def replace(self, **changes: Any) -> TrainState:
        """A copy with some fields changed (the state itself is never modified)."""
        return fast_replace(self, changes)


# torch's pytree view of a state (what `torch.func.vmap` flattens): the tensors are the
# children; everything else (Python numbers, the structure, the layout) is static context, so a
# stacked state vmaps with in_dims=0 while `step` and the counters stay host-side Python numbers
# (no host read per step) and stay leaves of functrain's own tree (the checkpoint's).
_CHILD_SLOTS = "_torch_child_slots"


def _torch_flatten(state: TrainState) -> tuple[list[Any], Any]:
    leaves, spec = tree_flatten(state)
    slots = state.__dict__.get(_CHILD_SLOTS)
    if slots is None:
        slots = frozenset(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor))
    children = [x for i, x in enumerate(leaves) if i in slots]
    static = tuple((i, x) for i, x in enumerate(leaves) if i not in slots)
    return children, (spec, static)


def _torch_unflatten(children: Any, context: Any) -> TrainState:
    spec, static = context
    children = list(children)
    fixed = dict(static)
    slots = [i for i in range(spec.num_leaves) if i not in fixed]
    leaves = [fixed.get(i) for i in range(spec.num_leaves)]
    for i, child in zip(slots, children):
        leaves[i] = child
    state = tree_unflatten(spec, leaves)
    if not all(isinstance(x, torch.Tensor) for x in children):
        # torch's pytree code rebuilds a tree with placeholders in the children's slots (vmap's
        # in_dims broadcast fills them with 0): remember the slots, so that flattening it again
        # gives the same structure although the placeholders are no tensors.
        state.__dict__[_CHILD_SLOTS] = frozenset(slots)
    return state


def _torch_flatten_with_keys(state: TrainState) -> tuple[list[tuple[str, Any]], Any]:
    children, context = _torch_flatten(state)
    slots = set(range(context[0].num_leaves)) - {i for i, _ in context[1]}
    paths = [p for i, (p, _) in enumerate(leaves_with_paths(state)) if i in slots]
    return list(zip(paths, children)), context


_torch.register_torch_pytree(TrainState, _torch_flatten, _torch_unflatten, _torch_flatten_with_keys)


def trainable_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters that require gradients (tied weights once)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def init(
    model: torch.nn.Module,
    optimizer: Any,
    *,
    seed: int = 0,
    mesh: Any = None,
    plan: Any = None,
) -> TrainState:
    """Build the initial `TrainState` of `model` trained by `optimizer`.

    The state's tensors share storage with the model's (no copy is made). A pure step never writes
    them; a donating step (`make_step(..., donate=True)`, the default inside `fit`) updates them in
    place, so the model's own parameters follow training exactly as in a plain PyTorch loop.

    Args:
        model: the module to train. Parameters with `requires_grad=False` are kept in
            `state.params` but get no optimizer state and are never updated.
        optimizer: a `functrain.optim.Transform`.
        seed: the run's seed; every random choice derives from it.
        mesh: a device mesh from `functrain.parallel.init_mesh`. None: one process, no
            sharding; under a launcher (WORLD_SIZE > 1), data-parallel over all ranks.
        plan: a sharding plan name ("ddp", "fsdp", "hsdp", "tp", ...) or a `Plan` (None: "ddp"
            when there is a mesh). With no mesh, the mesh is `init_mesh()` (all ranks).
            "local": no distribution even under a launcher (each rank trains on its own).
    Returns:
        the initial `TrainState` at step 0, its `layout` set when the params were placed.
    Example:
        >>> state = init(torch.nn.Linear(4, 2), functrain.optim.sgd(lr=0.1), seed=0)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"init expects a torch.nn.Module, got {type(model).__name__}")
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(
            "init expects an optimizer Transform with .init and .update (for example "
            f"functrain.optim.adamw(lr=1e-3)), got {type(optimizer).__name__}"
        )
    params = {name: p.detach() for name, p in model.named_parameters()}
    layout = None
    from .parallel.mesh import launched_world_size

    # One process and no mesh or plan asked for: nothing to place, so the plans (and DTensor,
    # about a second to import) stay unloaded.
    if mesh is not None or plan is not None or launched_world_size() > 1:
        from .parallel.placement import shard_params
        from .parallel.plans import default_placement

        mesh, plan = default_placement(mesh, plan)
        if mesh is not None:
            params, layout = shard_params(model, params, mesh=mesh, plan=plan, seed=seed)
    # After sharding: a meta-device model gets its buffers materialised there.
    buffers = {name: b.detach() for name, b in model.named_buffers()}
    trainable = set(trainable_names(model))
    opt_state = optimizer.init({k: v for k, v in params.items() if k in trainable})
    return TrainState(
        step=0,
        params=params,
        buffers=buffers,
        opt_state=opt_state,
        rng=RngState(seed=int(seed)),
        layout=layout,
    )
