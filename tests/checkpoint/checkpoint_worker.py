"""One rank of a multi-process checkpoint test (run by test_checkpoint_reshard.py on gloo).

    python checkpoint_worker.py ROOT RENDEZVOUS_DIR WORLD [WORLD ...]

For each world size in turn, the launcher forks that many ranks (so torch is imported once, not
once per rank; nothing has started threads before the fork). Each launch saves the reference state with this world size's placements into ROOT/saved_<WORLD>,
then loads every checkpoint under ROOT (saved by other world sizes, with other placements) into
yet other placements and checks every shard bitwise against the reference. It also saves through an
asynchronous `Manager` (its own gloo group, a background thread) and restores from it. Any mismatch
exits non-zero with a message.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import functrain.parallel
from functrain import _torch, checkpoint
from functrain.rng import RngState
from functrain.state import TrainState

SHAPES = {
    "w": ((10, 6), torch.float32),  # uneven on 3 and 4 ranks
    "b": ((7,), torch.bfloat16),
    "e": ((5, 3), torch.float8_e4m3fn),
    "i": ((9,), torch.int64),
    "m": ((6, 5), torch.float32),
    "tiny": ((2, 3), torch.float32),  # empty shards on 3 and 4 ranks
}


def reference() -> dict[str, torch.Tensor]:
    """The global tensors, identical on every rank and in the test process."""
    gen = torch.Generator().manual_seed(1234)
    out = {}
    for name, (shape, dtype) in SHAPES.items():
        if dtype == torch.int64:
            out[name] = torch.randint(-(2**40), 2**40, shape, generator=gen)
        else:
            out[name] = (torch.randn(shape, generator=gen) * 3).to(dtype)
    return out


def plans(world: int):
    """Placement plans for this world size: (name, mesh shape, {tensor: placements})."""
    if world == 4:
        yield (
            "2d",
            (2, 2),
            {
                "w": [Shard(0), Shard(1)],
                "b": [Replicate(), Shard(0)],
                "e": [Shard(1), Replicate()],
                "i": [Shard(0), Shard(0)],
                "m": [Replicate(), Replicate()],
                "tiny": [Shard(0), Replicate()],
            },
        )
    yield "shard0", (world,), {name: [Shard(0)] for name in SHAPES}
    yield (
        "mixed",
        (world,),
        {
            "w": [Shard(1)],
            "b": [Replicate()],
            "e": [Shard(0)],
            "i": [Replicate()],
            "m": [Shard(1)],
            "tiny": [Shard(0)],
        },
    )


def build(ref, mesh=None, placements=None, blank: bool = False) -> TrainState:
    """A TrainState of the tensors placed on `mesh` (None: plain tensors; `blank`: zeroed
    scalars, as a `like`)."""
    # Every rank holds the reference and cuts its own shard (gloo cannot scatter float8).
    params = {
        name: ref[name]
        if mesh is None
        else _torch.distribute_from_every_rank(ref[name], mesh, placements[name])
        for name in SHAPES
    }
    extra = {"note": "", "lr": 0.0} if blank else {"note": "resharded", "lr": 0.5}
    return TrainState(
        step=0 if blank else 3,
        params=params,
        buffers={},
        opt_state=(),
        rng=RngState(seed=0 if blank else 9),
        extra=extra,
    )


def zeros(ref):
    return {k: torch.zeros_like(v) for k, v in ref.items()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.contiguous(), b.contiguous()
    same = a.dtype == b.dtype and a.shape == b.shape
    return same and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def check(state, ref, where: str) -> None:
    assert state.step == 3 and state.rng.seed == 9, where
    assert state.extra == {"note": "resharded", "lr": 0.5}, where
    for name, value in state.params.items():
        assert isinstance(value, DTensor), f"{where}: {name} is not a DTensor"
        assert tuple(value.shape) == tuple(ref[name].shape), f"{where}: {name} global shape"
        # This rank's shard against the same region of the reference (gloo cannot all-gather
        # float8, and this checks each rank read exactly its own region).
        shape, offset = compute_local_shape_and_global_offset(
            value.shape, value.device_mesh, value.placements
        )
        region = tuple(slice(o, o + n) for o, n in zip(offset, shape))
        if not same_bits(value.to_local(), ref[name][region]):
            raise AssertionError(f"{where}: {name} differs from the reference")


def run_rank(rank: int, world: int, rendezvous: str, root: str) -> None:
    """One rank's part: save with this world's first plan, load everything with the others."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        ref = reference()
        all_plans = list(plans(world))
        name, mesh_shape, placements = all_plans[0]
        mesh = init_device_mesh("cpu", mesh_shape)
        checkpoint.save(os.path.join(root, f"saved_{world}"), build(ref, mesh, placements))
        dist.barrier()
        # Load every checkpoint present (other world sizes' included) with every other plan.
        for saved in sorted(d for d in os.listdir(root) if d.startswith("saved_")):
            for load_name, load_mesh_shape, load_placements in all_plans[1:]:
                load_mesh = init_device_mesh("cpu", load_mesh_shape)
                like = build(zeros(ref), load_mesh, load_placements, blank=True)
                state = checkpoint.load(os.path.join(root, saved), like=like)
                check(state, ref, f"rank {rank}/{world}: {saved} loaded as {load_name}")
        # An asynchronous manager: background thread, own gloo group, then restore resharded.
        manager = checkpoint.Manager(os.path.join(root, f"managed_{world}"), every="1ba")
        state = build(ref, mesh, placements)
        manager.save(state)
        manager.wait()
        _, last_mesh_shape, last_placements = all_plans[-1]
        like = build(zeros(ref), init_device_mesh("cpu", last_mesh_shape), last_placements, True)
        restored = checkpoint.load(manager.latest(), like=like)
        check(restored, ref, f"rank {rank}/{world}: async manager save")
        manager.close()
        dist.barrier()
    finally:
        functrain.parallel.shutdown()  # not a bare destroy: see test_torch_private


def launch(world: int, rendezvous: str, root: str) -> bool:
    """Fork `world` ranks (imports are paid once, in this process) and wait; True if all passed."""
    children = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:  # the child: run one rank, never return into the launcher
            code = 1
            try:
                run_rank(rank, world, rendezvous, root)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    running, ok = set(children), True
    while running:
        pid, status = os.wait()
        running.discard(pid)
        if status != 0 and ok:  # the others would wait forever in a collective: stop them
            ok = False
            for other in running:
                os.kill(other, signal.SIGKILL)
    return ok


def main() -> None:
    root, rendezvous_dir, worlds = sys.argv[1], sys.argv[2], [int(w) for w in sys.argv[3:]]
    for world in worlds:
        rendezvous = os.path.join(rendezvous_dir, f"rendezvous_{world}")
        if not launch(world, rendezvous, root):
            print(f"world size {world} failed", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
