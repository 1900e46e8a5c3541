"""Process groups and the named device mesh (`dp_replicate`, `dp_shard`, `tp`).

`init_mesh` works the same under torchrun (it reads RANK, WORLD_SIZE, MASTER_ADDR, ... from the
environment) and in a plain `python train.py` with no environment at all (a world of one process),
so a script written for one process runs unchanged on many.

The mesh always has the three named dims, in this order; unused ones have size 1. Data parallelism
is `dp_replicate x dp_shard` (HSDP when both exceed 1); `tp` is tensor parallelism. A mesh is a
value: `functrain.init(..., mesh=mesh)` records it in the state's `Layout`, and nothing here keeps
a "current" one.

Example:
    >>> mesh = init_mesh(dp_shard=-1)          # all ranks shard parameters (FSDP) or replicate (DDP)
    >>> mesh = init_mesh(dp_replicate=2, dp_shard=-1, tp=2)   # HSDP over TP
    >>> mesh.mesh_dim_names
    ('dp_replicate', 'dp_shard', 'tp')
"""

from __future__ import annotations

import datetime
import importlib
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .. import _torch
from . import teardown

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")
DP_DIMS = ("dp_replicate", "dp_shard")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_world_size() -> int:
    """Ranks of the world this process belongs to: the process group's, else `$WORLD_SIZE`."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def default_device_type() -> str:
    """ "cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def init_distributed(
    backend: str | None = None,
    timeout_s: float = 600.0,
    *,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> tuple[int, int]:
    """Initialise the default process group once; return `(rank, world_size)`.

    Reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK). With
    none of it set, makes a one-process world in memory (no ports, no files), so the same script
    runs with `python train.py` and with `python -m functrain.launch -n 4 train.py`. Processes
    started another way (`torch.multiprocessing.spawn`) pass `init_method` with their rank.
    Either way the groups and their threads are torn down at exit (`functrain.parallel.teardown`).

    Args:
        backend: "gloo", "nccl", ... (None: nccl for CUDA with gloo for CPU tensors, else gloo).
        timeout_s: how long a collective may wait for the other ranks before failing.
        init_method: a rendezvous URL such as "file:///tmp/store" (then `rank`, `world_size`).
        rank, world_size: this process's rank and the number of ranks, with `init_method`.
    Returns:
        `(rank, world_size)` of this process.
    Example:
        >>> init_distributed(init_method=f"file://{path}", rank=rank, world_size=2)  # in spawn
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    present = [v for v in _TORCHRUN_VARS if v in os.environ] if init_method is None else []
    if present and len(present) < len(_TORCHRUN_VARS):
        missing = [v for v in _TORCHRUN_VARS if v not in os.environ]
        raise RuntimeError(
            f"incomplete distributed environment: {present} are set but {missing} are not. "
            "Launch with `python -m functrain.launch -n N script.py` (or torchrun), or unset them "
            "to run as a single process."
        )
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Imported first on purpose: imported after the default group exists, this module captures
    # it in default arguments, and a group that cannot be freed keeps its gloo threads alive
    # into interpreter exit (see `functrain._torch.release_world_defaults`).
    importlib.import_module("torch.distributed.nn.functional")

    if init_method is not None:
        if rank is None or world_size is None:
            raise ValueError("init_distributed(init_method=...) needs rank= and world_size=")
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
        )
    elif present:
        store, rank, world = _attempt_store(timeout)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world, timeout=timeout
        )
    else:
        store = dist.HashStore()  # one process: nothing to rendezvous with
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout)
    # functrain made the default group, so it tears it down: at exit the groups are destroyed
    # and gloo's threads joined (a rank that exits with them alive can abort).
    teardown.register_exit_hook()
    return dist.get_rank(), dist.get_world_size()


def _attempt_store(timeout: datetime.timedelta) -> tuple[Any, int, int]:
    """torchrun's store, with keys private to this restart attempt; `(store, rank, world)`.

    Why: under `--max-restarts`, torchrun hands every attempt the same agent store with no
    per-attempt prefix, so gloo's rendezvous in attempt 2 can read the addresses that the dead
    ranks of attempt 1 published and fail with "Connection refused" (or hang). Prefixing the
    keys with the restart count gives each attempt a clean namespace.
    """
    from torch.distributed.rendezvous import rendezvous

    store, rank, world = next(rendezvous("env://", timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None:
        store = dist.PrefixStore(f"functrain/attempt_{attempt}", store)
    return store, rank, world


def shutdown() -> None:
    """Destroy the process groups and stop their threads (safe to call twice).

    Never needed at the end of a script: `functrain.parallel.teardown` does it at exit, in an order that
    cannot abort. Call it to release the groups earlier. (No module here holds a mesh or a
    group: they live in the states' layouts, so nothing is left to forget first.)
    """
    teardown.shutdown()


def _resolve_sizes(world: int, dp_replicate: int, dp_shard: int, tp: int) -> tuple[int, int, int]:
    sizes = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp}
    for name, size in sizes.items():
        if not isinstance(size, int) or size == 0 or size < -1:
            raise ValueError(
                f"init_mesh: {name} must be a positive int or -1 (infer), got {size!r}"
            )
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"init_mesh: only one dim may be -1 (inferred), got {free}")
    known = 1
    for size in sizes.values():
        known *= size if size != -1 else 1
    if free:
        if world % known:
            raise ValueError(
                f"init_mesh: the world has {world} ranks, not divisible by the fixed dims "
                f"{ {k: v for k, v in sizes.items() if v != -1} } (product {known})"
            )
        sizes[free[0]] = world // known
    product = sizes["dp_replicate"] * sizes["dp_shard"] * sizes["tp"]
    if product != world:
        raise ValueError(
            f"init_mesh: dp_replicate*dp_shard*tp = {product} but the world has {world} ranks; "
            "make the product match or pass -1 for one dim to infer it"
        )
    return sizes["dp_replicate"], sizes["dp_shard"], sizes["tp"]


def init_mesh(
    dp_shard: int = -1,
    dp_replicate: int = 1,
    tp: int = 1,
    *,
    device_type: str | None = None,
    backend: str | None = None,
) -> DeviceMesh:
    """Initialise distribution (if needed) and make a 3-D mesh.

    Args:
        dp_shard: ranks that shard parameters under FSDP (-1: whatever the other dims leave).
        dp_replicate: replicas of the sharded group (HSDP when > 1 with `dp_shard` > 1).
        tp: tensor-parallel degree (consecutive ranks, so a TP group stays inside a node).
        device_type: "cpu" or "cuda" (None: cuda when available).
        backend: process-group backend (None: see `init_distributed`).
    Returns:
        a `DeviceMesh` with dims `("dp_replicate", "dp_shard", "tp")`.
    Example:
        >>> mesh = init_mesh(dp_shard=-1)   # 1 rank under `python`, N under the launcher
    """
    _, world = init_distributed(backend)
    shape = _resolve_sizes(world, dp_replicate, dp_shard, tp)
    mesh = init_device_mesh(device_type or default_device_type(), shape, mesh_dim_names=MESH_DIMS)
    dp_group(mesh)  # made now: creating a group is collective, so every rank must take part
    teardown.release_at_exit(mesh)  # its groups are freed at exit even if the mesh lives on
    return mesh


def check_mesh(mesh: Any) -> DeviceMesh:
    """`mesh` if it is a DeviceMesh with functrain's named dims, else a clear error."""
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(
            f"expected a DeviceMesh from functrain.parallel.init_mesh(...), got {type(mesh).__name__}"
        )
    if tuple(mesh.mesh_dim_names or ()) != MESH_DIMS:
        raise ValueError(
            f"the mesh must have dims {MESH_DIMS} (make it with functrain.parallel.init_mesh), "
            f"got {mesh.mesh_dim_names}"
        )
    return mesh


def dim_size(mesh: DeviceMesh, name: str) -> int:
    """Size of the named mesh dim."""
    return mesh.size(MESH_DIMS.index(name))


def dim_rank(mesh: DeviceMesh, name: str) -> int:
    """This rank's coordinate along the named mesh dim."""
    return mesh.get_local_rank(MESH_DIMS.index(name))


def dim_group(mesh: DeviceMesh, name: str):
    """The process group of the named mesh dim (this rank's slice)."""
    return mesh.get_group(MESH_DIMS.index(name))


def dp_size(mesh: DeviceMesh) -> int:
    """Data-parallel world size: `dp_replicate * dp_shard`."""
    return dim_size(mesh, "dp_replicate") * dim_size(mesh, "dp_shard")


def dp_rank(mesh: DeviceMesh) -> int:
    """This rank's index among the data-parallel ranks (equal across a TP group)."""
    return dim_rank(mesh, "dp_replicate") * dim_size(mesh, "dp_shard") + dim_rank(mesh, "dp_shard")


def dp_group(mesh: DeviceMesh):
    """One process group over both data-parallel dims (see `dp_mesh`)."""
    return dp_mesh(mesh).get_group()


def dim_mesh(mesh: DeviceMesh, name: str) -> DeviceMesh:
    """The 1-D mesh of the named dim (this rank's slice): its `get_group()` is `dim_group`'s."""
    return mesh[name]


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh over both data-parallel dims.

    For HSDP the two dims are flattened into one mesh dim; the mesh itself keeps the flattened
    mesh (torch caches it on the root mesh), so only the first call creates a group, and that
    first call is collective: `init_mesh` makes it on every rank.
    """
    if dim_size(mesh, "dp_replicate") == 1:
        return dim_mesh(mesh, "dp_shard")
    if dim_size(mesh, "dp_shard") == 1:
        return dim_mesh(mesh, "dp_replicate")
    return _torch.flatten_mesh(mesh[DP_DIMS], "dp")
