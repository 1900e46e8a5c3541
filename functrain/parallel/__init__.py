"""Distribution: device meshes, sharding plans and the step's collectives.

    mesh = functrain.parallel.init_mesh(dp_shard=-1)          # torchrun's world, or one process
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan="fsdp")
    step = functrain.make_step(model, loss_fn, opt)       # unchanged: the step reads the placements

Plans: "ddp", "fsdp", "hsdp", "tp", "tp+fsdp" (and "tp+ddp", "tp+hsdp"), or a `Plan` with mixed
precision (`fsdp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`). See `plans`.
"""

from ..optim.base import global_norm  # the cross-shard norm, one implementation for both
from .comm import COUNTER, CommCounter, ring_bytes
from .compute import (
    accumulate_grads,
    data_parallel_info,
    finalize_grads,
    full_params,
    gather_params,
    mean_over_data_parallel,
    reduce_local_grads,
)
from .mesh import (
    MESH_DIMS,
    current_mesh,
    dp_group,
    init_distributed,
    init_mesh,
    set_current_mesh,
    shutdown,
)
from .plans import Plan, ddp, fsdp, hsdp, resolve_plan, shard_params, tp

__all__ = [
    "COUNTER",
    "CommCounter",
    "MESH_DIMS",
    "Plan",
    "accumulate_grads",
    "current_mesh",
    "data_parallel_info",
    "ddp",
    "dp_group",
    "finalize_grads",
    "fsdp",
    "full_params",
    "gather_params",
    "global_norm",
    "hsdp",
    "init_distributed",
    "init_mesh",
    "mean_over_data_parallel",
    "reduce_local_grads",
    "resolve_plan",
    "ring_bytes",
    "set_current_mesh",
    "shard_params",
    "shutdown",
    "tp",
]
