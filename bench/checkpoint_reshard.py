"""Checkpoint resharding: a state saved on 2 ranks loaded on 3, functrain vs DCP (gloo, CPU).

Two ranks save the same sharded state (DTensors, `Shard(0)` on a 1-D mesh, ~`--mb` MB, rows that
do not divide by 3) with functrain and with `torch.distributed.checkpoint`, once per repetition;
then three ranks load every saved copy into their own `Shard(0)` placements, alternating
functrain and DCP (the order flips each repetition), after one untimed load of each. A load is timed from a barrier to the
barrier after it, so the figure is the slowest rank's. The first repetition also checks that
both loads gave the same shards.

Run:
    python bench/checkpoint_reshard.py [--mb 96] [--reps 3]
    (bench/checkpoint.py runs it and adds its row to the table and the JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = 1024
ROWS = 1000  # uneven on 3 ranks: every load reads regions that straddle the saved shards


def _state(mb: float, mesh) -> dict:
    """`{name: DTensor}` of about `mb` MB, the same values on every world size."""
    from torch.distributed.tensor import Shard, distribute_tensor

    count = max(1, round(mb * 2**20 / (ROWS * WIDTH * 4)))
    gen = torch.Generator().manual_seed(0)
    return {
        f"w{i}": distribute_tensor(torch.randn(ROWS, WIDTH, generator=gen), mesh, [Shard(0)])
        for i in range(count)
    }


def _barrier() -> float:
    """The clock once every rank got here: a load timed between two is the slowest rank's."""
    torch.distributed.barrier()
    return time.perf_counter()


def worker(args) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from functrain import checkpoint

    torch.distributed.init_process_group("gloo")
    torch.set_num_threads(1)
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    state = _state(args.mb, mesh)
    times: dict[str, list[float]] = {"functrain": [], "dcp": []}
    if args.worker == "load":  # first calls pay one-time costs (imports, thread pools): untimed
        warm = {k: torch.zeros_like(v) for k, v in state.items()}
        checkpoint.load(os.path.join(args.dir, "functrain-0"), like=warm)
        dcp.load(warm, checkpoint_id=os.path.join(args.dir, "dcp-0"))
    for rep in range(args.reps):
        ours, theirs = (os.path.join(args.dir, f"{k}-{rep}") for k in ("functrain", "dcp"))
        if args.worker == "save":
            checkpoint.save(ours, state)
            dcp.save(state, checkpoint_id=theirs)
            continue
        order = ["functrain", "dcp"] if rep % 2 == 0 else ["dcp", "functrain"]
        loaded = {}
        for name in order:
            like = {k: torch.zeros_like(v) for k, v in state.items()}
            if name == "functrain":
                start = _barrier()
                loaded["functrain"] = checkpoint.load(ours, like=like)
            else:
                start = _barrier()
                dcp.load(like, checkpoint_id=theirs)
                loaded["dcp"] = like
            times[name].append(_barrier() - start)
        if rep == 0:
            for key, value in loaded["dcp"].items():
                mine = loaded["functrain"][key].to_local()
                assert torch.equal(mine, value.to_local()), f"{key} differs on rank {rank}"
                assert torch.equal(mine, state[key].to_local()), f"{key} is not the saved value"
    if args.worker == "load" and rank == 0:
        mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
        with open(args.out, "w") as f:
            json.dump({"mb": mb, "leaves": len(state), "times_s": times}, f)
    torch.distributed.destroy_process_group()


def _launch(world: int, args, role: str, workdir: str, out: str) -> None:
    command = [sys.executable, "-m", "functrain.launch", "-n", str(world), "--no-prefix"]
    command += [os.path.abspath(__file__), "--worker", role, "--dir", workdir, "--out", out]
    command += ["--mb", str(args.mb), "--reps", str(args.reps)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {world}-rank {role} failed:\n{proc.stderr[-5000:]}")


def measure(mb: float, reps: int, directory: str | None = None) -> dict:
    """Save on 2 ranks, load on 3; `{"mb", "leaves", "times_s": {"functrain", "dcp"}}` plus
    medians and the ratio of medians."""
    args = argparse.Namespace(mb=mb, reps=reps)
    with tempfile.TemporaryDirectory(prefix="functrain-bench-reshard-", dir=directory) as tmp:
        out = os.path.join(tmp, "result.json")
        _launch(2, args, "save", tmp, out)
        _launch(3, args, "load", tmp, out)
        with open(out) as f:
            result = json.load(f)
    medians = {k: statistics.median(v) for k, v in result["times_s"].items()}
    result["median_s"] = medians
    result["ratio_vs_dcp"] = medians["functrain"] / medians["dcp"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/checkpoint_reshard.py")
    parser.add_argument("--mb", type=float, default=96.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--worker", choices=("save", "load"), default=None)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    result = measure(args.mb, args.reps, args.dir)
    print(json.dumps({k: v for k, v in result.items() if k != "times_s"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
