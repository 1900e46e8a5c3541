"""`Layout`: how one model's parameters sit on the mesh, as a value that travels with its state.

`functrain.init(model, opt, mesh=, plan=)` (through `placement.shard_params`) returns the state with
its `Layout` in `state.layout`: the mesh, each parameter's policy (dtypes, gather at use), the
flat buckets the step communicates in, the tensor-parallel styles and this rank's data-parallel
coordinates. Every function of `functrain.parallel` that needs one of these takes the layout as
an argument; nothing in the process remembers a "current" mesh or plan, so two models in one
process (a GAN, a frozen teacher, an EMA copy) never see each other's sharding, even when their
parameter names are the same.

A layout is frozen and compares by value. `TrainState` keeps it as static metadata (not a leaf):
`tree_map` over states, `state.replace(...)` and loading a checkpoint into a `like` state all
keep it, and a checkpoint never stores it (the arrays carry their own placements).

Example:
    >>> state = functrain.init(model, opt, mesh=mesh, plan="fsdp")
    >>> state.layout.plan.name, functrain.parallel.data_parallel_info(state.layout)
    ('fsdp', (0, 2))
    >>> state.layout.policy("fc1.weight").param_dtype is None
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .._lazy import is_dtensor
from . import flat, teardown
from .mesh import MESH_DIMS, dim_mesh, dim_rank, dim_size, dp_mesh, dp_rank, dp_size

if TYPE_CHECKING:  # DTensor is imported where one exists, not by `import functrain`
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    from .plans import Plan


@dataclasses.dataclass(frozen=True)
class ParamPolicy:
    """How one parameter is communicated (from its plan).

    Attributes:
        param_dtype: dtype it is gathered and computed in (None: its own).
        reduce_dtype: dtype its gradient is reduced in (None: the compute dtype).
        bucket_bytes: bytes per flat bucket.
        reshard: gathered when its module runs and freed after (`reshard_after_forward`).
        offload: its shard, its gradient's shard and its optimizer state live in host memory
            between steps, and the optimizer updates it there (`fsdp(offload=True)`, see
            `parallel.offload`).
        pin_memory: with `offload` on CUDA, the host copies are page-locked (pinned).
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    bucket_bytes: int = 25 << 20
    reshard: bool = False
    offload: bool = False
    pin_memory: bool = True

    @classmethod
    def from_plan(cls, plan: Plan) -> ParamPolicy:
        return cls(
            plan.param_dtype,
            plan.reduce_dtype,
            int(plan.bucket_mb * (1 << 20)),
            plan.reshard_after_forward,
            plan.offload,
            plan.pin_memory,
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    """One model's parameters on a mesh: placements' policies, buckets, coordinates.

    Attributes:
        mesh: the `(dp_replicate, dp_shard, tp)` DeviceMesh.
        plan: the `Plan` it was made from.
        policies: `((param name, ParamPolicy), ...)` in parameter order.
        buckets: the flat buckets over every parameter (trainable and frozen apart).
        tp_styles: `((module name, style), ...)` of the tensor-parallel Linear layers.
        dp_rank, dp_size: this rank's data-parallel coordinate and the number of data-parallel
            ranks (`dp_replicate * dp_shard`; tensor-parallel ranks of one replica share one).
    """

    mesh: DeviceMesh
    plan: Plan
    policies: tuple[tuple[str, ParamPolicy], ...]
    buckets: tuple[flat.Bucket, ...]
    tp_styles: tuple[tuple[str, str], ...] = ()
    dp_rank: int = 0
    dp_size: int = 1
    # The 1-D meshes of the groups, sliced once (slicing costs milliseconds; a group lookup
    # from a 1-D mesh microseconds). No group is kept: each is looked up from its mesh.
    _dim_meshes: dict[str, Any] = dataclasses.field(
        default_factory=dict, compare=False, repr=False, init=False
    )
    _policy_of: dict[str, ParamPolicy] = dataclasses.field(
        default_factory=dict, compare=False, repr=False, init=False
    )
    _bucket_names: frozenset = dataclasses.field(
        default=frozenset(), compare=False, repr=False, init=False
    )
    _offloaded: bool = dataclasses.field(default=False, compare=False, repr=False, init=False)

    def __post_init__(self) -> None:
        meshes = {
            "dp": dp_mesh(self.mesh),
            "dp_shard": dim_mesh(self.mesh, "dp_shard"),
            "dp_replicate": dim_mesh(self.mesh, "dp_replicate"),
            "tp": dim_mesh(self.mesh, "tp"),
        }
        object.__setattr__(self, "_dim_meshes", meshes)
        teardown.release_at_exit(self.mesh)  # a state alive at exit must not pin the groups
        object.__setattr__(self, "_policy_of", dict(self.policies))
        names = frozenset(s.name for b in self.buckets for s in b.slots)
        object.__setattr__(self, "_bucket_names", names)
        object.__setattr__(self, "_offloaded", any(p.offload for _, p in self.policies))

    def __hash__(self) -> int:  # consistent with the field-wise __eq__; Plan may hold a dict
        return hash((self.mesh, self.buckets, self.dp_rank))

    # -- lookups -------------------------------------------------------------------------------

    def policy(self, name: str) -> ParamPolicy:
        """The policy of parameter `name` (KeyError naming the layout's parameters if unknown)."""
        try:
            return self._policy_of[name]
        except KeyError:
            raise KeyError(
                f"parameter {name!r} is not in this layout (it has {sorted(self._policy_of)[:8]}"
                f"{' ...' if len(self._policy_of) > 8 else ''}); use the layout of the state the "
                "parameters come from"
            ) from None

    @property
    def offloaded(self) -> bool:
        """True when some parameter's shard lives in host memory (`fsdp(offload=True)`)."""
        return self._offloaded

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype inputs are cast to before the model runs (the plan's `param_dtype`)."""
        return self.plan.param_dtype

    @property
    def dp_group(self) -> Any:
        """One process group over both data-parallel dims."""
        return self._dim_meshes["dp"].get_group()

    @property
    def shard_group(self) -> Any:
        """The process group of `dp_shard` (FSDP's all-gather / reduce-scatter)."""
        return self._dim_meshes["dp_shard"].get_group()

    @property
    def replicate_group(self) -> Any:
        """The process group of `dp_replicate` (HSDP's all-reduce across replicas)."""
        return self._dim_meshes["dp_replicate"].get_group()

    @property
    def tp_group(self) -> Any:
        """The process group of `tp` (tensor-parallel layers' all-reduces)."""
        return self._dim_meshes["tp"].get_group()

    @property
    def replicas(self) -> int:
        """Size of `dp_replicate`."""
        return dim_size(self.mesh, "dp_replicate")

    def buckets_for(self, params: Mapping[str, Any]) -> tuple[flat.Bucket, ...]:
        """The buckets that carry exactly the DTensors of `params`.

        The step gathers the trainable and the frozen parameters apart, and evaluation gathers
        all of them: each is a union of whole buckets of the layout. Any other subset gets
        buckets of its own, built on the spot.

        Raises:
            ValueError: a DTensor of `params` is not in the layout.
        """
        dtensors = {k: v for k, v in params.items() if is_dtensor(v)}
        if not dtensors:
            return ()
        present = 0
        chosen = []
        partial = False
        for bucket in self.buckets:
            found = sum(1 for s in bucket.slots if s.name in dtensors)
            if found == len(bucket.slots):
                chosen.append(bucket)
                present += found
            elif found:
                partial = True
        if not partial and present == len(dtensors):
            return tuple(chosen)
        unknown = [k for k in dtensors if k not in self._bucket_names]
        if unknown:
            raise ValueError(
                f"parameters {unknown[:5]} are DTensors that this layout does not place; pass "
                "the layout of the state they belong to (state.layout)"
            )
        return tuple(build_buckets(self.mesh, dtensors, self._policy_of, trainable=None))

    def __copy__(self) -> Layout:
        return self

    def __deepcopy__(self, memo: dict) -> Layout:
        return self  # a frozen value whose mesh is a process handle: never copied


def check_placements(name: str, p: DTensor) -> None:
    """A clear error unless `p` is placed the way functrain's step expects."""
    from torch.distributed.tensor import Partial, Replicate  # loaded: `p` is a DTensor

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


def build_buckets(
    mesh: DeviceMesh,
    params: Mapping[str, DTensor],
    policies: Mapping[str, ParamPolicy],
    trainable: frozenset[str] | None,
) -> list[flat.Bucket]:
    """The flat buckets of `params` (DTensors) on `mesh`.

    Args:
        mesh: their mesh.
        params: `{name: DTensor}` in parameter order.
        policies: `{name: ParamPolicy}` (missing names: the default policy).
        trainable: names that take gradients (None: those whose DTensor requires grad).
    Returns:
        the buckets, ordered by their first parameter.
    """
    from torch.distributed.tensor import Shard  # loaded: `params` are DTensors

    n = dim_size(mesh, "dp_shard")
    rank = dim_rank(mesh, "dp_shard")
    entries = []
    cap = None
    for name, p in params.items():
        check_placements(name, p)
        policy = policies.get(name, ParamPolicy())
        cap = policy.bucket_bytes if cap is None else cap
        compute_dtype = policy.param_dtype or p.dtype
        reduce_dtype = policy.reduce_dtype or compute_dtype
        local_shape = tuple(p.to_local().shape)
        shard = p.placements[1]
        frozen = not (p.requires_grad if trainable is None else name in trainable)
        at_use = None
        if isinstance(shard, Shard) and n > 1:
            compute_shape = list(local_shape)
            compute_shape[shard.dim] = p.shape[shard.dim]
            slot = flat.make_slot(name, tuple(compute_shape), shard.dim, n, rank, 0)
            kind = flat.Kind.SHARD
            if policy.reshard and not frozen:  # one bucket per module: gathered at use
                at_use = name.rpartition(".")[0]
        else:
            slot = flat.make_slot(name, local_shape, None, 1, 0, 0)
            kind = flat.Kind.REPLICATE
        entries.append(
            flat.Entry(
                slot, kind, compute_dtype, reduce_dtype, p.dtype, frozen=frozen, at_use=at_use
            )
        )
    return flat.build_buckets(entries, cap or (25 << 20))


def make_layout(
    mesh: DeviceMesh,
    plan: Plan,
    params: Mapping[str, DTensor],
    *,
    trainable: frozenset[str],
    tp_styles: Mapping[str, str] | None = None,
) -> Layout:
    """The `Layout` of `params` placed on `mesh` by `plan` (called by `placement.shard_params`).

    Args:
        mesh: the mesh.
        plan: the plan that placed them.
        params: `{name: DTensor}` in parameter order (tied weights once).
        trainable: names of the parameters that take gradients.
        tp_styles: `{module name: style}` of the tensor-parallel Linear layers.
    Returns:
        the frozen `Layout`.
    """
    policy = ParamPolicy.from_plan(plan)
    policies = {name: policy for name in params}
    buckets = build_buckets(mesh, params, policies, frozenset(trainable))
    return Layout(
        mesh=mesh,
        plan=plan,
        policies=tuple(policies.items()),
        buckets=tuple(buckets),
        tp_styles=tuple((tp_styles or {}).items()),
        dp_rank=dp_rank(mesh),
        dp_size=dp_size(mesh),
    )


def data_parallel_info(layout: Layout | None) -> tuple[int, int]:
    """`(dp_rank, dp_size)` of `layout` (`(0, 1)` for None: one process, no sharding).

    Tensor-parallel ranks of one replica share a data-parallel rank (they read the same batch).

    Example:
        >>> rank, world = data_parallel_info(state.layout)
        >>> loader = Loader(dataset, 256, rank=rank, world_size=world)
    """
    if layout is None:
        return 0, 1
    if not isinstance(layout, Layout):
        raise TypeError(
            f"data_parallel_info takes a functrain.parallel.Layout (state.layout) or None, got "
            f"{type(layout).__name__}"
        )
    return layout.dp_rank, layout.dp_size
