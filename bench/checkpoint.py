"""Checkpoint I/O: functrain vs torch.save/torch.load vs torch.distributed.checkpoint, on one state.

One TrainState (an MLP with AdamW moments, ~100 MB by default) is saved and loaded by every
variant in turn, interleaved and repeated (the order rotates each repetition so a shared disk's
drifts hit all variants alike); the table shows median seconds and MB/s, against the disk's raw
sequential write speed (one file, write + fsync) and read speed. Then the asynchronous save: the
time `Manager.save` blocks the step, next to copies into preallocated host buffers (on a CPU the
save makes that copy; from CUDA it only queues it on the stream, so it blocks for less). A
small state (~0.8 MB in 112 leaves) is saved by functrain, torch.save and DCP, all with fsync:
there the cost is the number of files. Then a 2 -> 3 rank reshard on gloo against DCP
(`bench/checkpoint_reshard.py`, its own processes). Last, issue 27's targets as ratios of this
run's medians.

Notes on fairness: functrain and raw writes make every file durable (functrain with one syncfs
per save before its commit marker); torch.save and DCP do not, so they are also shown with an
fsync. Loads read files just written (page cache warm for every variant alike). Deleting
checkpoints between repetitions is not timed.

Run:
    python bench/checkpoint.py [--megabytes 100] [--reps 5] [--dir /tmp]
    python -m bench checkpoint [...]
Writes bench/results/checkpoint.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

if __package__ in (None, ""):  # run as `python bench/checkpoint.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import functrain  # noqa: E402
from bench import checkpoint_reshard, checkpoint_tiers  # noqa: E402
from bench.common import RESULTS_DIR, environment, markdown_table, timestamp, write_json  # noqa: E402
from functrain import checkpoint  # noqa: E402
from functrain.tree import leaves_with_paths, tree_map  # noqa: E402


def build_state(megabytes: float, seed: int = 0, device: str = "cpu") -> functrain.TrainState:
    """An MLP's TrainState (params + AdamW mu/nu, random values) of about `megabytes` MB."""
    width = 1024
    layer_bytes = (width * width + width) * 4 * 3  # weights + bias, and two AdamW moments
    layers = max(1, round(megabytes * 2**20 / layer_bytes))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    state = functrain.init(model, functrain.optim.adamw(lr=1e-3), seed=seed)
    gen = torch.Generator().manual_seed(seed)

    def fill(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.randn(x.shape, generator=gen).to(device)
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return state.replace(
        params=tree_map(fill, state.params),
        buffers=tree_map(fill, state.buffers),
        opt_state=tree_map(fill, state.opt_state),
    )


def build_small_state(seed: int = 0) -> functrain.TrainState:
    """A small TrainState (~0.8 MB in 112 leaves: 16 layers' params and AdamW moments), the size
    of a small CNN's: what a per-epoch checkpoint of a small model costs is file count, not MB."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(16)])
    return functrain.init(model, functrain.optim.adamw(lr=1e-3), seed=seed)


def tensor_bytes(state) -> int:
    return sum(
        v.numel() * v.element_size()
        for _, v in leaves_with_paths(state)
        if isinstance(v, torch.Tensor)
    )


def flat_dict(state) -> dict:
    """The state as `{dotted key: leaf}`: what torch.save and DCP are given."""
    return dict(leaves_with_paths(state))


def _fsync_tree(path: str) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb+") as f:
                os.fsync(f.fileno())


class Variants:
    """Each variant is `save(path)` / `load(path)`; paths are fresh for every repetition."""

    def __init__(self, state):
        self.state = state
        self.flat = flat_dict(state)
        self.blob = b"".join(  # the same bytes, for the raw disk speed
            v.cpu().numpy().tobytes() for v in self.flat.values() if isinstance(v, torch.Tensor)
        )
        self.mb = len(self.blob) / 2**20

    def raw_save(self, path):
        with open(path, "wb") as f:
            f.write(self.blob)
            f.flush()
            os.fsync(f.fileno())

    def raw_load(self, path):
        with open(path, "rb") as f:
            f.read()

    def functrain_save(self, path):
        checkpoint.save(path, self.state)

    def functrain_save_nosync(self, path):
        checkpoint.save(path, self.state, storage_options={"fsync": False})

    def functrain_load(self, path):
        checkpoint.load(path, like=self.state)

    def torch_save(self, path):
        torch.save(self.flat, path)

    def torch_save_fsync(self, path):
        torch.save(self.flat, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())

    def torch_load(self, path):
        torch.load(path, weights_only=True)

    def dcp_save(self, path):
        import torch.distributed.checkpoint as dcp

        dcp.save(self.flat, checkpoint_id=path, no_dist=True)

    def dcp_save_fsync(self, path):
        self.dcp_save(path)
        _fsync_tree(path)

    def dcp_load(self, path):
        import torch.distributed.checkpoint as dcp

        target = {
            k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else v)
            for k, v in self.flat.items()
        }
        dcp.load(target, checkpoint_id=path, no_dist=True)


SAVES = [
    "raw_save",
    "functrain_save",
    "functrain_save_nosync",
    "torch_save",
    "torch_save_fsync",
    "dcp_save",
    "dcp_save_fsync",
]
LOADS = {
    "raw_save": "raw_load",
    "functrain_save": "functrain_load",
    "torch_save": "torch_load",
    "dcp_save": "dcp_load",
}


LABELS = {
    "raw_save": "disk: raw write + fsync",
    "raw_load": "disk: raw read",
    "functrain_save": "functrain save (fsync, default)",
    "functrain_save_nosync": "functrain save (fsync=False)",
    "functrain_load": "functrain load",
    "torch_save": "torch.save",
    "torch_save_fsync": "torch.save + fsync",
    "torch_load": "torch.load",
    "dcp_save": "torch.distributed.checkpoint save",
    "dcp_save_fsync": "torch.distributed.checkpoint save + fsync",
    "dcp_load": "torch.distributed.checkpoint load",
    "small_functrain_save": "small state: functrain save (fsync)",
    "small_torch_save_fsync": "small state: torch.save + fsync",
    "small_dcp_save_fsync": "small state: torch.distributed.checkpoint save + fsync",
}


def _torch_reference(key: str) -> str:
    if key.startswith("small_"):
        return "small_torch_save_fsync"
    return "torch_save" if "save" in key else "torch_load"


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def _timed(fn: Callable[[str], None], path: str) -> float:
    start = time.perf_counter()
    fn(path)
    return time.perf_counter() - start


def measure_io(
    variants: Variants, workdir: str, reps: int, loads: bool = True
) -> dict[str, list[float]]:
    """Seconds per repetition of every save (and load) variant, interleaved, rotating order."""
    times: dict[str, list[float]] = {name: [] for name in [*SAVES, *LOADS.values()]}
    for rep in range(reps):
        order = SAVES[rep % len(SAVES) :] + SAVES[: rep % len(SAVES)]
        for name in order:
            path = os.path.join(workdir, f"{name}-{rep}")
            times[name].append(_timed(getattr(variants, name), path))
            if loads and name in LOADS:
                times[LOADS[name]].append(_timed(getattr(variants, LOADS[name]), path))
            _remove(path)
    return times


def measure_small(variants: Variants, workdir: str, reps: int) -> dict[str, list[float]]:
    """Seconds per save of the small state, functrain vs torch.save and DCP, all with fsync."""
    names = ["functrain_save", "torch_save_fsync", "dcp_save_fsync"]
    times: dict[str, list[float]] = {f"small_{name}": [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            path = os.path.join(workdir, f"small-{name}-{rep}")
            times[f"small_{name}"].append(_timed(getattr(variants, name), path))
            _remove(path)
    return times


def measure_async(state, workdir: str, reps: int) -> dict[str, list[float]]:
    """Blocked time of an asynchronous save vs the plain device-to-host copy, per repetition.

    The reference is `tensor.to("cpu", copy=True)`, as a hand-written async save would take it
    (on a CPU-only machine, a clone); the floors copy into buffers allocated beforehand (pinned
    on a GPU machine): one thread of `np.copyto` per tensor, and torch's own `copy_` (on CPU,
    multi-threaded over torch's intra-op threads). The goal is against the faster of the two.

    Every variant writes into buffers of its own, once a repetition, and the order rotates, as
    in `measure_io`: a copy into buffers that the line before had just written finds them in
    the cache (on a machine whose last-level cache holds a 100 MB state, ~5% faster), which a
    save, whose buffers were last written one save ago, never does.
    """
    out: dict[str, list[float]] = {
        "copy_fresh": [],
        "copy_into_buffers": [],
        "copy_into_buffers_torch": [],
        "async_blocked": [],
        "async_total": [],
    }
    tensors = [v for _, v in leaves_with_paths(state) if isinstance(v, torch.Tensor)]
    pin = torch.cuda.is_available() and tensors[0].device.type == "cuda"

    def preallocated() -> list[torch.Tensor]:
        buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in tensors]
        for buffer in buffers:
            buffer.zero_()  # touched once, as the manager's buffers are after its first save
        return buffers

    def synchronize() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def fresh() -> None:
        [t.to("cpu", copy=True) for t in tensors]
        synchronize()

    numpy_buffers, torch_buffers = preallocated(), preallocated()

    def into() -> None:
        for buf, t in zip(numpy_buffers, tensors):
            if t.device.type == "cpu":
                np.copyto(buf.numpy(), t.numpy())
            else:
                buf.copy_(t, non_blocking=True)
        synchronize()

    def into_torch() -> None:
        for buf, t in zip(torch_buffers, tensors):
            buf.copy_(t, non_blocking=True)
        synchronize()

    # keep_last=None: retention's deletions (rmtree) would otherwise count as save time.
    manager = checkpoint.Manager(
        os.path.join(workdir, "async"), every=None, keep_last=None, async_save=True
    )
    saves = 0

    def save() -> None:
        nonlocal saves
        saves += 1
        start = time.perf_counter()
        manager.save(state.replace(step=saves))
        blocked = time.perf_counter() - start
        manager.wait()
        total = time.perf_counter() - start
        if saves > 1:  # the first save allocates the manager's host buffers
            out["async_blocked"].append(blocked)
            out["async_total"].append(total)

    copies = {"copy_fresh": fresh, "copy_into_buffers": into, "copy_into_buffers_torch": into_torch}
    try:
        save()
        for rep in range(reps):
            names = [*copies, "save"]
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                if name == "save":
                    save()
                else:
                    start = time.perf_counter()
                    copies[name]()
                    out[name].append(time.perf_counter() - start)
    finally:
        manager.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench checkpoint", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--mb", "--megabytes", type=float, default=100.0, help="state size in MB (default 100)"
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument(
        "--small-reps", type=int, default=None, help="repetitions of the small state (default 3x)"
    )
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--device", default="cpu", help="where the state lives (cpu, cuda)")
    parser.add_argument(
        "--reshard-reps", type=int, default=3, help="repetitions of the 2 -> 3 reshard (0: skip)"
    )
    parser.add_argument(
        "--saves-only",
        action="store_true",
        help="only the save rows (big and small state): no loads, async, tiers or reshard",
    )
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "checkpoint.json"))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.saves_only:
        return saves_only(args)

    state = build_state(args.mb, device=args.device)
    nbytes = tensor_bytes(state)
    mb = nbytes / 2**20
    workdir = tempfile.mkdtemp(prefix="functrain-bench-ckpt-", dir=args.dir)
    try:
        variants = Variants(state)
        print(
            f"state: {mb:.1f} MB in {len(variants.flat)} leaves; {args.reps} reps in {workdir}",
            flush=True,
        )
        io_times = measure_io(variants, workdir, args.reps)
        small = Variants(build_small_state())
        small_reps = args.small_reps or 3 * args.reps
        io_times.update(measure_small(small, workdir, small_reps))
        async_times = measure_async(state, workdir, args.reps)
        tiers = checkpoint_tiers.measure(state, workdir, args.reps)  # issue 29's rows
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    reshard = None
    if args.reshard_reps:
        print("reshard: 2 -> 3 ranks (gloo) ...", flush=True)
        reshard = checkpoint_reshard.measure(args.mb, args.reshard_reps, args.dir)

    median = {k: statistics.median(v) for k, v in {**io_times, **async_times}.items()}
    raw_write, raw_read = mb / median["raw_save"], mb / median["raw_load"]
    rows, results = [], {}
    for key, label in LABELS.items():
        seconds = median[key]
        small_state = key.startswith("small_")
        rate = (small.mb if small_state else mb) / seconds
        ratio = seconds / median[_torch_reference(key)]
        raw = None if small_state else rate / (raw_write if "save" in key else raw_read)
        rows.append([label, seconds, rate, ratio, raw])
        results[key] = {
            "label": label,
            "median_s": seconds,
            "mb_per_s": rate,
            "vs_torch": ratio,
            "times_s": io_times[key],
        }
    print()
    print(markdown_table(["variant", "median s", "MB/s", "time vs torch", "of raw disk"], rows))
    copy = median["copy_fresh"]
    async_rows = [
        ["device-to-host copy: tensor.to(cpu, copy=True)", copy, 1.0],
        [
            "floor: np.copyto into preallocated (pinned) buffers, one thread",
            median["copy_into_buffers"],
            median["copy_into_buffers"] / copy,
        ],
        [
            "floor: torch copy_ into preallocated (pinned) buffers",
            median["copy_into_buffers_torch"],
            median["copy_into_buffers_torch"] / copy,
        ],
        [
            "Manager.save, async: step blocked",
            median["async_blocked"],
            median["async_blocked"] / copy,
        ],
        [
            "Manager.save, async: until committed",
            median["async_total"],
            median["async_total"] / copy,
        ],
    ]
    print()
    print(markdown_table(["async save", "median s", "vs copy"], async_rows))
    if reshard is not None:
        reshard_rows = [
            [f"2 -> 3 ranks: {name} load", seconds, reshard["mb"] / seconds]
            for name, seconds in reshard["median_s"].items()
        ]
        print()
        print(markdown_table(["reshard (slowest rank)", "median s", "MB/s"], reshard_rows))
    ratios = {  # issue 27's targets, as ratios of medians measured in this one run
        "load / raw read (<= 1.5)": median["functrain_load"] / median["raw_load"],
        "load / DCP load (<= 1.0)": median["functrain_load"] / median["dcp_load"],
        "save / torch.save+fsync (<= 1.1)": median["functrain_save"] / median["torch_save_fsync"],
        "small save / torch.save+fsync (<= 2.0)": median["small_functrain_save"]
        / median["small_torch_save_fsync"],
        "async blocked / fastest copy into buffers (<= 1.0)": median["async_blocked"]
        / min(median["copy_into_buffers"], median["copy_into_buffers_torch"]),
    }
    limits = [1.5, 1.0, 1.1, 2.0, 1.0]
    if reshard is not None:
        ratios["reshard 2->3 / DCP load (<= 1.5)"] = reshard["ratio_vs_dcp"]
        limits.append(1.5)
    goals = {name: value <= limit for (name, value), limit in zip(ratios.items(), limits)}
    print()
    print(markdown_table(["ratio", "value", "met"], [[n, v, goals[n]] for n, v in ratios.items()]))
    print("\n" + checkpoint_tiers.tables(tiers, mb))
    payload = {
        "suite": "checkpoint",
        "time": timestamp(),
        "environment": environment(),
        "state_mb": mb,
        "leaves": len(variants.flat),
        "reps": args.reps,
        "io": results,
        "async": {k: {"median_s": median[k], "times_s": v} for k, v in async_times.items()},
        "small_state": {"mb": small.mb, "leaves": len(small.flat), "reps": small_reps},
        "reshard": reshard,
        "ratios": ratios,
        "goals": goals,
        "tiers": tiers,
    }
    print(f"\nwrote {write_json(args.out, payload)}")
    return 0


def saves_only(args) -> int:
    """The save rows alone, for a quick look at save speed (a 1 GB state in minutes)."""
    state = build_state(args.mb, device=args.device)
    workdir = tempfile.mkdtemp(prefix="functrain-bench-ckpt-", dir=args.dir)
    try:
        variants, small = Variants(state), Variants(build_small_state())
        times = measure_io(variants, workdir, args.reps, loads=False)
        times.update(measure_small(small, workdir, args.small_reps or 3 * args.reps))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in times.items() if v}
    rows = []
    for key, seconds in median.items():
        mb = small.mb if key.startswith("small_") else variants.mb
        raw = None if key.startswith("small_") else mb / median["raw_save"]
        rows.append([LABELS[key], seconds, mb / seconds, seconds / median[_torch_reference(key)]])
        rows[-1].append(None if raw is None else (mb / seconds) / raw)
    print(f"state: {variants.mb:.1f} MB in {len(variants.flat)} leaves; {args.reps} reps")
    print(markdown_table(["variant", "median s", "MB/s", "time vs torch", "of raw disk"], rows))
    big = median["functrain_save"] / median["torch_save_fsync"]
    tiny = median["small_functrain_save"] / median["small_torch_save_fsync"]
    print(f"\nsave / torch.save+fsync: {big:.3f} (goal <= 1.1)")
    print(f"small save / torch.save+fsync: {tiny:.3f} (goal <= 2.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
