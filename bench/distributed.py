"""Distributed training: functrain's DDP and FSDP steps vs PyTorch's DDP and FSDP2, gloo on CPU.

    python bench/distributed.py                 # 2 and 4 ranks, prints a table
    python -m bench distributed --worlds 2 --reps 3

For each world size, one launch (`python -m functrain.launch -n N`) runs the variants side by side
in the same processes, on the same model (an MLP of `--depth` Linear+GELU layers of width
`--width`) and the same global batch:

    functrain_ddp    functrain.init(..., plan="ddp")  + make_step(donate=True)
    torch_ddp        torch.nn.parallel.DistributedDataParallel + torch.optim.AdamW(foreach)
    functrain_fsdp   functrain.init(..., plan="fsdp") + make_step(donate=True)
    functrain_fsdp_reshard   the same with fsdp(reshard_after_forward=True): gathered per
                     module at use, freed after, gathered again for the backward pass
    torch_fsdp2      fully_shard(each Linear), fully_shard(model) + torch.optim.AdamW(foreach)
    functrain_local  the functrain step on the rank's slice alone (no mesh, no communication)
    torch_local      the hand-written loop on the rank's slice alone
    *_clip           functrain_ddp, torch_ddp, functrain_fsdp_reshard, torch_fsdp2 with global-
                     norm clipping: chain(clip_by_global_norm(1.0), adamw(1e-3)) (one fused
                     AdamW kernel, the clip as its gradient scale) against clip_grad_norm_

The two local variants separate the cost of distribution from the step's own overhead: the
distribution overhead is (functrain_X / torch_X) / (functrain_local / torch_local).

Step time: `bench.common.interleave` (blocks of steps, variants in rotating order, median over
repetitions); the ratio is functrain / PyTorch per repetition, then the median. Rank 0's clock.

Peak memory per rank: the rise of the process's resident high-water mark while a variant is
built and trains (see `peak_rss`), the maximum over ranks.

Bytes communicated per step: a `TorchDispatchMode` that sees every collective on its way to the
backend -- the `c10d.*` ops issued by `torch.distributed` calls, DDP's C++ reducer and FSDP2, and
the `_c10d_functional.*` ops DTensor issues -- and adds the bytes each rank sends under ring
algorithms (`functrain.parallel.comm.ring_bytes`: all-reduce 2(n-1)/n x size, all-gather and
reduce-scatter (n-1)/n x the full buffer). The theoretical volume per step, with P the parameter
bytes: DDP 2(n-1)/n P; FSDP2 3(n-1)/n P (all-gather forward, again backward, reduce-scatter);
functrain's FSDP 2(n-1)/n P (it gathers once per step and keeps the whole parameters until the
backward pass ends, trading memory for a third less traffic); with reshard_after_forward 3(n-1)/n P
like FSDP2, less the backward gather that the first module never needs (its input takes no
gradient, so autograd never asks for its weights again).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    Runner,
    environment,
    interleave,
    markdown_table,
    timestamp,
    write_json,
)

VARIANTS = (
    "functrain_ddp",
    "torch_ddp",
    "functrain_fsdp",
    "functrain_fsdp_reshard",
    "torch_fsdp2",
    "functrain_local",
    "torch_local",
    "functrain_ddp_clip",
    "torch_ddp_clip",
    "functrain_fsdp_reshard_clip",
    "torch_fsdp2_clip",
)
PAIRS = {
    "functrain_ddp": "torch_ddp",
    "functrain_fsdp": "torch_fsdp2",
    "functrain_fsdp_reshard": "torch_fsdp2",
    "functrain_local": "torch_local",
    "functrain_ddp_clip": "torch_ddp_clip",
    "functrain_fsdp_reshard_clip": "torch_fsdp2_clip",
}
CLIP = "_clip"  # the variant with chain(clip_by_global_norm(1.0), adamw) / clip_grad_norm_
# theoretical bytes sent per step, in units of (n-1)/n x parameter bytes
THEORY = {
    "functrain_ddp": 2.0,
    "torch_ddp": 2.0,
    "functrain_fsdp": 2.0,
    "functrain_fsdp_reshard": 3.0,
    "torch_fsdp2": 3.0,
    "functrain_local": 0.0,
    "torch_local": 0.0,
}
THEORY.update({name + CLIP: THEORY[name] for name in ("functrain_ddp", "torch_ddp",
               "functrain_fsdp_reshard", "torch_fsdp2")})  # fmt: skip


# -- the model and data --------------------------------------------------------------------------


def build_model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


def local_batch(width: int, global_batch: int, rank: int, world: int):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(global_batch, width, generator=gen)
    y = torch.randn(global_batch, width, generator=gen)
    per = global_batch // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def mse_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


# -- the variants --------------------------------------------------------------------------------


def make_runner(name: str, args, mesh) -> Runner:
    """Build variant `name` (model, optimizer, step) on this rank, on `mesh`."""
    import functrain
    from functrain import parallel as fdist
    from functrain.parallel import mesh as fmesh

    rank, world = fmesh.dp_rank(mesh), fmesh.dp_size(mesh)
    batch = local_batch(args.width, args.global_batch, rank, world)
    model = build_model(args.width, args.depth)
    clip = name.endswith(CLIP)
    name = name.removesuffix(CLIP)
    if name.startswith("functrain"):
        local = name == "functrain_local"  # the same step on this rank alone: no mesh
        opt = functrain.optim.adamw(1e-3)
        if clip:  # the fused executor folds the clip into the kernel's gradient scale
            opt = functrain.optim.chain(functrain.optim.clip_by_global_norm(1.0), opt)
        plan = {
            "functrain_local": "local",
            "functrain_ddp": "ddp",
            "functrain_fsdp": "fsdp",
            "functrain_fsdp_reshard": fdist.fsdp(reshard_after_forward=True),
        }[name]
        state = functrain.init(model, opt, seed=0, mesh=None if local else mesh, plan=plan)
        holder = {"state": state}
        step = functrain.make_step(model, mse_loss, opt, donate=True)

        def run(n):
            stamps = []
            for _ in range(n):
                holder["state"], _ = step(holder["state"], batch)
                stamps.append(time.perf_counter())
            return stamps

        return Runner(name + (CLIP if clip else ""), run)
    if name == "torch_local":
        pass
    elif name == "torch_ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def run(n):
        stamps = []
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            mse_loss(model, batch).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            stamps.append(time.perf_counter())
        return stamps

    return Runner(name + (CLIP if clip else ""), run)


# -- counting bytes ------------------------------------------------------------------------------


def collective_counter():
    """A dispatch mode that adds up the ring bytes of every collective issued under it."""
    from torch.distributed.distributed_c10d import ProcessGroup, _resolve_process_group
    from torch.utils._python_dispatch import TorchDispatchMode

    from functrain.parallel.comm import ring_bytes

    def nbytes(x):
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (list, tuple)):
            return sum(nbytes(t) for t in x)
        return 0

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sent = 0.0
            self.calls: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func)
            if "c10d" in name and "wait" not in name:
                self._count(name, list(args) + list(kwargs.values()))
            return func(*args, **kwargs)

        def _count(self, name, args):
            group = None
            for a in args:  # c10d ops carry the group as a TorchScript object
                if isinstance(a, ProcessGroup):
                    group = a
                elif isinstance(a, torch.ScriptObject) and group is None:
                    try:
                        group = ProcessGroup.unbox(a)
                    except RuntimeError:  # a ReduceOp, not the group
                        pass
            for a in args if group is None else ():  # functional collectives: a group name
                if isinstance(a, str) and a:
                    try:
                        group = _resolve_process_group(a)
                        break
                    except (RuntimeError, ValueError):  # the reduce op ("sum"), not a group
                        pass
            n = group.size() if group is not None else 1
            if "reduce_scatter" in name:
                op, payload = "reduce_scatter", nbytes(args[1] if "_base" in name else args[0])
                if "functional" in name:
                    payload = nbytes(args[0])
            elif "allgather" in name or "all_gather" in name:
                op = "all_gather"
                payload = nbytes(args[0]) * (n if "functional" in name else 1)
            elif "allreduce" in name or "all_reduce" in name:
                op, payload = "all_reduce", nbytes(args[0])
            elif "broadcast" in name:
                op, payload = "broadcast", nbytes(args[0])
            else:
                return
            self.calls[op] = self.calls.get(op, 0) + 1
            self.sent += ring_bytes(op, payload, n)

    return Counter()


# -- peak memory ---------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_rss(build, *, steps: int) -> dict:
    """Peak resident memory a variant adds to this process while it is built and trains.

    Resets the kernel's high-water mark (`/proc/self/clear_refs`), builds the variant and trains
    `steps` steps, and reads `VmHWM - VmRSS(before)`. The driver runs the ranks with
    `MALLOC_MMAP_THRESHOLD_=65536`, so every tensor buffer of 64 KiB or more is its own mapping and
    goes back to the kernel when freed: the high-water mark follows live tensors (and gloo's
    buffers, alike for every variant). torch.profiler's allocation totals are no use here: they
    drift upward when tensors are freed on gloo's and autograd's threads.
    """
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kib("VmRSS")
    runner = build()
    runner.run(steps)
    peak, steady = _status_kib("VmHWM") - base, _status_kib("VmRSS") - base
    runner.close()
    del runner
    gc.collect()
    return {"peak_bytes": peak * 1024, "steady_bytes": steady * 1024}


# -- one rank ------------------------------------------------------------------------------------


def worker(args) -> None:
    """Measure every variant on this rank; rank 0 writes the JSON."""
    # DTensor first, so that no variant's peak memory counts its import (functrain's plans
    # import it lazily, on first use).
    import torch.distributed.tensor  # noqa: F401

    from functrain import parallel as fdist

    rank, world = fdist.init_distributed()
    mesh = fdist.init_mesh(dp_shard=-1)
    out = {"world": world, "variants": {}}
    param_bytes = sum(
        p.numel() * p.element_size() for p in build_model(args.width, args.depth).parameters()
    )
    out["param_bytes"] = param_bytes

    def max_over_ranks(value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t)

    # One throwaway run first: what a process builds once (imports, gloo's and the allocator's
    # first buffers) would otherwise be charged to whichever variant happens to come first.
    peak_rss(lambda: make_runner(VARIANTS[0], args, mesh), steps=4)
    for name in VARIANTS:
        memory = peak_rss(lambda name=name: make_runner(name, args, mesh), steps=4)
        runner = make_runner(name, args, mesh)
        runner.run(2)
        with collective_counter() as counter:
            runner.run(args.count_steps)
        sent = counter.sent / args.count_steps
        out["variants"][name] = {
            "peak_mib": max_over_ranks(memory["peak_bytes"]) / 2**20,
            "steady_mib": max_over_ranks(memory["steady_bytes"]) / 2**20,
            "sent_bytes_per_step": sent,
            "calls_per_step": {k: v / args.count_steps for k, v in counter.calls.items()},
            "theory_bytes_per_step": THEORY[name] * (world - 1) / world * param_bytes,
        }
        runner.close()
    runners = {name: make_runner(name, args, mesh) for name in VARIANTS}
    for runner in runners.values():
        runner.run(args.warmup)
    timing = interleave(runners, steps=args.steps, reps=args.reps)["variants"]
    for name, result in timing.items():
        out["variants"][name]["median_ms"] = result["median_ms"]
        out["variants"][name]["times_ms"] = result["times_ms"]
    for ours, theirs in PAIRS.items():
        ratios = [a / b for a, b in zip(timing[ours]["times_ms"], timing[theirs]["times_ms"])]
        out["variants"][ours]["ratio_vs_torch"] = statistics.median(ratios)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    fdist.shutdown()


# -- the driver ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/distributed.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--count-steps", type=int, default=2, help="steps to count bytes over")
    parser.add_argument("--json", default=os.path.join(RESULTS_DIR, "distributed.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict | None:
    """Run the benchmark (or, with --worker, one rank of it); print a table, write the JSON."""
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args)
        return None
    results = {
        "suite": "distributed",
        "time": timestamp(),
        "environment": environment(),
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "out", "json")},
        "worlds": {},
    }
    for world in args.worlds:
        if args.global_batch % world:
            raise SystemExit(
                f"--global-batch {args.global_batch} is not divisible by {world} ranks"
            )
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rank0.json")
            command = [
                sys.executable,
                "-m",
                "functrain.launch",
                "-n",
                str(world),
                "--no-prefix",
                os.path.abspath(__file__),
                "--worker",
                "--out",
                out,
            ]
            for key in ("width", "depth", "global_batch", "steps", "reps", "warmup", "count_steps"):
                command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
            env = dict(
                os.environ,
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                MALLOC_MMAP_THRESHOLD_="65536",  # freed tensors leave the RSS (see peak_rss)
            )
            print(f"distributed: {world} ranks ...", flush=True)
            proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"the {world}-rank run failed:\n{proc.stderr[-5000:]}")
            with open(out) as f:
                results["worlds"][str(world)] = json.load(f)
    print(report(results))
    write_json(args.json, results)
    print(f"wrote {args.json}")
    return results


def report(results: dict) -> str:
    """The results as a markdown table."""
    rows = []
    for world, data in results["worlds"].items():
        for name, v in data["variants"].items():
            theory = v["theory_bytes_per_step"]
            rows.append(
                [
                    world,
                    name,
                    v["median_ms"],
                    v.get("ratio_vs_torch"),
                    v["peak_mib"],
                    v["sent_bytes_per_step"] / 2**20,
                    theory / 2**20,
                    v["sent_bytes_per_step"] / theory if theory else None,
                ]
            )
    header = ["ranks", "variant", "step ms", "vs torch", "peak MiB/rank", "sent MiB/step",
              "theory MiB/step", "sent/theory"]  # fmt: skip
    return markdown_table(header, rows)


if __name__ == "__main__":
    main()
