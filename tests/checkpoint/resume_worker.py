"""Ranks of test_checkpoint_resume.py's multi-process test (gloo, forked so torch loads once).

    python resume_worker.py ROOT RENDEZVOUS_FILE OUT_DIR WORLD

Each rank holds a DTensor sharded on dim 0, so each reads only its own chunk. The ranks save
steps 1 and 2 through a Manager; rank 0 then flips a byte in the chunk of step 2 that only the
*last* rank reads. A strict Manager (fallback=False) must fail on every rank and rename
nothing; a default Manager must restore step 1 on every rank (agreeing, although rank 0 read
its own part of step 2 without error), set step 2 aside, and hold the lease on rank 0 only.
Each rank writes what it saw to OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard

import functrain
from functrain import _torch, checkpoint


def state(step: int, mesh) -> functrain.TrainState:
    full = torch.arange(60, dtype=torch.float32).reshape(10, 6) + 1000 * step
    w = _torch.distribute_from_every_rank(full, mesh, [Shard(0)])  # no scatter: any torch
    return functrain.TrainState(step=step, params={"w": w}, buffers={}, opt_state=(),
                                rng=functrain.RngState(seed=step))  # fmt: skip


def run_rank(rank: int, world: int, rendezvous: str, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))  # fmt: skip
    seen: dict = {"pid": os.getpid()}
    try:
        mesh = init_device_mesh("cpu", (world,))
        saver = checkpoint.Manager(root, every=None, async_save=True)
        for step in (1, 2):
            saver.save(state(step, mesh))
        saver.close()
        dist.barrier()
        if rank == 0:  # the last rank's chunk of step 2 (chunks follow the shards)
            chunk = os.path.join(root, "step_000000002", "params.w", "c", str(world - 1), "0")
            data = bytearray(Path(chunk).read_bytes())
            data[3] ^= 0x20
            os.unlink(chunk)
            Path(chunk).write_bytes(bytes(data))
        dist.barrier()
        strict = checkpoint.Manager(root, every=None, fallback=False)
        try:
            strict.restore(state(0, mesh))
            seen["strict"] = "restored"
        except checkpoint.CheckpointCorruptError as err:
            seen["strict"] = type(err).__name__
        strict.close()
        dist.barrier()
        seen["after_strict"] = sorted(n for n in os.listdir(root) if n.startswith("step_"))
        dist.barrier()
        manager = checkpoint.Manager(root, every=None)
        restored = manager.restore(state(0, mesh))
        seen["step"] = restored.step
        expected = state(1, mesh).params["w"].to_local()
        seen["values"] = bool(torch.equal(restored.params["w"].to_local(), expected))
        seen["lease"] = json.loads(Path(os.path.join(root, "LEASE.json")).read_text())["pid"]
        dist.barrier()
        seen["after"] = sorted(n for n in os.listdir(root) if n.startswith("step_"))
        manager.close()
        dist.barrier()
    finally:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)
        functrain.parallel.shutdown()  # not a bare destroy: see test_torch_private


def main() -> None:
    root, rendezvous, out, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    children = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run_rank(rank, world, rendezvous, root, out)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    failed = False
    for _ in children:
        pid, status = os.wait()
        if status != 0 and not failed:
            failed = True
            for other in children:
                if other != pid:
                    try:
                        os.kill(other, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
