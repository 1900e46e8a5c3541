"""Sharding plans: which placement every parameter gets on the `(dp_replicate, dp_shard, tp)` mesh.

    ddp      Replicate everywhere; gradients all-reduced over the data-parallel ranks.
    fsdp     Shard(0) on `dp_shard` (parameters, gradients and optimizer state sharded);
             gathered for compute, gradients reduce-scattered.
    hsdp     fsdp on a 2-D data-parallel mesh: sharded on `dp_shard`, replicated on `dp_replicate`
             (the same placements; the mesh decides).
    tp       Column/row-parallel Linear layers sharded on `tp` (see `tensor_parallel`).
    tp+fsdp  both (FSDP takes a dim that TP leaves whole); also "tp+ddp", "tp+hsdp".

With `fsdp(offload=True)` each rank's shards are placed in host memory instead (pinned on CUDA),
and the step copies them to the device when it runs (see `parallel.offload`).

A plan is a value: `parallel.placement.shard_params` places a model's parameters by it, and the
state's `Layout` keeps it (the plan lives in that value, not in the model or the process).

Example:
    >>> mesh = functrain.parallel.init_mesh(dp_shard=-1)
    >>> state = functrain.init(model, opt, seed=0, mesh=mesh, plan="fsdp")
    >>> state = functrain.init(model, opt, mesh=mesh, plan=fsdp(param_dtype=torch.bfloat16))
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

import torch
import torch.distributed as dist

from .mesh import init_mesh, launched_world_size


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a model's parameters are laid out on the mesh.

    Attributes:
        name: for messages ("ddp", "fsdp", "tp+fsdp", ...).
        shard: shard parameters over `dp_shard` (FSDP/HSDP); else replicate them (DDP).
        tp: None (no tensor parallelism), "auto", or `{module name pattern: style}` with styles
            "colwise", "rowwise", "colwise_gather".
        param_dtype: dtype parameters are gathered and computed in (None: their own).
        reduce_dtype: dtype gradients are reduced in (None: the compute dtype).
        bucket_mb: parameters per collective, in MiB (flat buffers; larger = fewer, bigger calls).
        reshard_after_forward: sharded plans only. False (default): gather every parameter once
            per step and keep it until the backward pass ends (2x parameter bytes moved per
            step). True: gather each module's parameters when it runs, free them when it
            returns and gather them again for the backward pass (3x the bytes, as FSDP2), so a
            rank holds about one module's whole parameters at a time (see `parallel.reshard`).
        offload: sharded plans without tensor parallelism only. True: the parameter shards,
            their gradients and the optimizer state live in host memory between steps and the
            optimizer runs there (Composer's `cpu_offload`, FSDP2's `CPUOffloadPolicy`; see
            `parallel.offload`).
        pin_memory: with `offload` on CUDA, page-locked host copies (faster, asynchronous).
    """

    name: str
    shard: bool = False
    tp: str | Mapping[str, str] | None = None
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    bucket_mb: float = 25.0
    reshard_after_forward: bool = False
    offload: bool = False
    pin_memory: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.offload, bool):
            raise TypeError(
                f"plan {self.name!r}: offload must be True or False, got {self.offload!r}"
            )
        if self.offload and not self.shard:
            raise ValueError(
                f"plan {self.name!r}: offload=True keeps each rank's *shards* in host memory, so "
                "it needs a sharded plan: use fsdp(offload=True) or hsdp(offload=True) (a "
                "replicated plan would keep a whole copy of the model per rank on the host)"
            )
        if self.offload and self.tp is not None:
            raise ValueError(
                f"plan {self.name!r}: offload=True is not supported with tensor parallelism (the "
                "tensor-parallel layers run on their device shards); use fsdp(offload=True) or "
                "hsdp(offload=True) on a mesh without tp"
            )


def ddp(**options) -> Plan:
    """Replicated parameters, all-reduced gradients (`options`: `Plan` fields)."""
    return Plan(name="ddp", shard=False, **options)


def fsdp(**options) -> Plan:
    """Parameters, gradients and optimizer state sharded on `dp_shard`."""
    return Plan(name="fsdp", shard=True, **options)


def hsdp(**options) -> Plan:
    """fsdp within `dp_shard`, replicated across `dp_replicate` (make the mesh 2-D)."""
    return Plan(name="hsdp", shard=True, **options)


def tp(styles: str | Mapping[str, str] = "auto", *, shard: bool = False, **options) -> Plan:
    """Tensor parallelism on `tp`, with FSDP on `dp_shard` when `shard` (else DDP)."""
    return Plan(name="tp+fsdp" if shard else "tp", shard=shard, tp=styles, **options)


_NAMED = {
    "ddp": lambda: ddp(),
    "fsdp": lambda: fsdp(),
    "hsdp": lambda: hsdp(),
    "tp": lambda: tp(),
    "tp+ddp": lambda: tp(),
    "tp+fsdp": lambda: tp(shard=True),
    "fsdp+tp": lambda: tp(shard=True),
    "tp+hsdp": lambda: tp(shard=True),
    "hsdp+tp": lambda: tp(shard=True),
}


def resolve_plan(plan: str | Plan | None) -> Plan:
    """A `Plan` from a name ("ddp", "fsdp", "hsdp", "tp", "tp+fsdp", "tp+hsdp", "tp+ddp") or a Plan."""
    if plan is None:
        return ddp()
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, str) and plan.lower() in _NAMED:
        return _NAMED[plan.lower()]()
    raise ValueError(
        f"unknown sharding plan {plan!r}; use one of {sorted(_NAMED)} or a functrain.parallel.Plan"
    )


LOCAL = "local"  # the plan name for "no distribution", even under a launcher


def default_placement(mesh, plan) -> tuple:
    """The `(mesh, plan)` that `functrain.init` uses for its `mesh=` and `plan=` arguments.

    - `plan="local"`: `(None, None)`, each process on its own (no mesh may be given);
    - a mesh: the plan, "ddp" by default;
    - a plan and no mesh: the mesh `init_mesh()` (every rank on `dp_shard`); a tensor-parallel
      plan needs a mesh with a `tp` dim, so it must be given one;
    - neither: one process stays `(None, None)`; under a launcher (more than one rank), as in
      Composer and Lightning, data-parallel over all ranks, said in one line on rank 0, rather
      than N independent trainings writing one checkpoint folder.

    Returns:
        `(mesh or None, plan or None)`; None for both means no distribution.
    """
    if isinstance(plan, str) and plan.lower() == LOCAL:
        if mesh is not None:
            raise ValueError(
                "plan='local' trains each process on its own and takes no mesh; drop mesh= or "
                "pick a distributed plan ('ddp', 'fsdp', ...)"
            )
        return None, None
    if mesh is not None:
        return mesh, plan
    if plan is not None:
        resolved = resolve_plan(plan)
        if resolved.tp is not None:
            raise ValueError(
                f"plan={resolved.name!r} needs a mesh with a tp dim: pass "
                "mesh=functrain.parallel.init_mesh(tp=N)"
            )
        return init_mesh(), resolved
    world = launched_world_size()
    if world <= 1:
        return None, None
    mesh = init_mesh()
    if dist.get_rank() == 0:
        print(
            f"functrain: {world} ranks and no mesh given: training data-parallel (plan='ddp') "
            f"over all {world} ranks; pass mesh=/plan= to choose (plan='local' trains each "
            "rank on its own)",
            file=sys.stderr,
            flush=True,
        )
    return mesh, ddp()
