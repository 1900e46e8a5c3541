"""Distribution: device meshes, sharding plans, the `Layout` value and the step's collectives.

    mesh = functrain.parallel.init_mesh(dp_shard=-1)          # torchrun's world, or one process
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan="fsdp")
    state.layout                                          # the Layout: mesh, policies, buckets
    step = functrain.make_step(model, loss_fn, opt)       # unchanged: the step reads state.layout

Plans: "ddp", "fsdp", "hsdp", "tp", "tp+fsdp" (and "tp+ddp", "tp+hsdp"), or a `Plan` with mixed
precision (`fsdp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`), gathering at use
(`fsdp(reshard_after_forward=True)`) or the shards and optimizer state in host memory
(`fsdp(offload=True)`, see `offload`); "local" for none.
Under a launcher, `init` without a mesh trains data-parallel over all ranks. See `plans`.

Nothing here keeps process-wide state except the collective counter `COUNTER`: the layout is a
value in the state, and what one step has in flight lives in that step's `InFlight`.

The plans (`ddp`, `fsdp`, `Plan`, ...) are imported when first read: they build DTensors, and
importing `torch.distributed.tensor` costs ~0.7 s that a one-process run never needs (see
`functrain._lazy`). The rest never imports it unless a DTensor exists.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .collectives import InFlight
from .comm import COUNTER, CommCounter, ring_bytes
from .compute import (
    accumulate_grads,
    finalize_grads,
    gather_params,
    mean_over_data_parallel,
    reduce_local_grads,
)
from .layout import Layout, ParamPolicy, data_parallel_info
from .mesh import MESH_DIMS, dp_group, init_distributed, init_mesh, shutdown
from .running import running
from .views import full_params, full_value, norms

if TYPE_CHECKING:
    from .placement import shard_params
    from .plans import LOCAL, Plan, ddp, fsdp, hsdp, resolve_plan, tp
    from .sync_bn import SyncBatchNorm, sync_batchnorm

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(("LOCAL", "Plan", "ddp", "fsdp", "hsdp", "resolve_plan", "tp"), ".plans"),
        "shard_params": ".placement",
        "SyncBatchNorm": ".sync_bn",
        "sync_batchnorm": ".sync_bn",
    },
)

__all__ = [
    "COUNTER",
    "CommCounter",
    "InFlight",
    "LOCAL",
    "Layout",
    "MESH_DIMS",
    "ParamPolicy",
    "Plan",
    "accumulate_grads",
    "data_parallel_info",
    "ddp",
    "dp_group",
    "finalize_grads",
    "fsdp",
    "full_params",
    "full_value",
    "gather_params",
    "hsdp",
    "init_distributed",
    "init_mesh",
    "mean_over_data_parallel",
    "norms",
    "reduce_local_grads",
    "resolve_plan",
    "ring_bytes",
    "running",
    "shard_params",
    "shutdown",
    "sync_batchnorm",
    "SyncBatchNorm",
    "tp",
]
