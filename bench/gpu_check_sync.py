"""gpu_check's `sync_count`: the device synchronisations of `fit`'s steps between log boundaries.

Issue 27: a step of `fit` reads nothing back to the host between log, evaluation and checkpoint
boundaries; several ranks agree on stopping and on the clock in an all-reduce that is started
without waiting and read one boundary later, behind a CUDA event (not a stream or device sync).
This check runs `fit` on a small GPT with `torch.cuda.set_sync_debug_mode` switched on around
the steps between log boundaries (a callback switches it on at each batch start that is not
followed by a log, and off before the log's batch) and counts the synchronising CUDA calls torch
reports there:

- on one rank (no mesh), and
- on every visible GPU under NCCL (one process per GPU, `plan="ddp"` and `plan="fsdp"`), when
  there are at least 2 (NCCL refuses two ranks on one GPU).

The mode is "warn" rather than "error" so that every synchronisation is counted, with its
message, instead of the first one ending the run; "error" fails on exactly the same calls. The
first WARMUP_BATCHES steps (lazy initialisation, allocator growth) are left out of the window.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from typing import Any

import torch

STEPS = 24
LOG_EVERY = 8  # log boundaries at 8, 16, 24: the window holds the batches in between
WARMUP_BATCHES = 2


def _set_mode(mode: str) -> None:
    if torch.cuda.is_available():  # a CPU dry run (--device cpu) only exercises the code
        torch.cuda.set_sync_debug_mode(mode)


class SyncWindow:
    """Switches torch's sync debug mode on for the steps between log boundaries."""

    def __init__(self, mode: str = "warn"):
        self.mode = mode
        self.batches = 0  # steps trained inside the window

    def batch_start(self, ctx):
        batch = ctx.timestamp.batch + 1  # the batch this step trains
        inside = batch > WARMUP_BATCHES and batch % LOG_EVERY != 0
        self.batches += inside
        _set_mode(self.mode if inside else "default")

    def fit_end(self, ctx):
        _set_mode("default")


def count_syncs(ctx, mesh=None, plan=None) -> dict[str, Any]:
    """One `fit` of STEPS steps on cuda; the synchronisations reported inside the window."""
    import functrain
    from bench.gpu_check import gpt_loss, gpt_setup

    model, batches, _ = gpt_setup(ctx)
    opt = functrain.optim.adamw(3e-4)
    kwargs = {"mesh": mesh, "plan": plan} if mesh is not None else {}
    state = functrain.init(model, opt, seed=0, **kwargs)
    step = functrain.make_step(model, gpt_loss, opt, precision="amp_bf16")
    data = [batches[i % len(batches)] for i in range(STEPS)]  # already on the device
    window = SyncWindow()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            functrain.fit(
                step, state, data, duration=f"{STEPS}ba", callbacks=[window],
                log_interval=f"{LOG_EVERY}ba", eval_interval=None, progress=False,
            )  # fmt: skip
        finally:
            _set_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    return {"syncs": len(syncs), "steps_in_window": window.batches, "first": syncs[:2]}


def _rank(rank: int, world: int, store: str, out: str, ctx) -> None:
    from functrain import parallel
    from functrain.parallel.mesh import init_distributed

    torch.cuda.set_device(rank)
    init_distributed(backend="nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = parallel.init_mesh(device_type="cuda")
    found = {plan: count_syncs(ctx, mesh, plan) for plan in ("ddp", "fsdp")}
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(found, f)


def check_sync_count(ctx):
    """The check: syncs between log boundaries on one rank, and per rank under NCCL."""
    from bench.gpu_check import Result, ok

    values: dict[str, Any] = {"one_rank": count_syncs(ctx)}
    world = torch.cuda.device_count() if ctx.device == "cuda" else 0
    note = f"{world} GPU(s)"
    if world >= 2:
        with tempfile.TemporaryDirectory() as tmp:
            torch.multiprocessing.spawn(
                _rank, args=(world, os.path.join(tmp, "store"), tmp, ctx), nprocs=world
            )
            for rank in range(world):
                with open(os.path.join(tmp, f"{rank}.json")) as f:
                    for plan, found in json.load(f).items():
                        values[f"{plan}_rank{rank}"] = found
    else:
        note += ": the NCCL rows need 2 GPUs (not run)"
    counts = {name: v["syncs"] for name, v in values.items()}
    first = next((v["first"][0] for v in values.values() if v["first"]), "")
    measured = ", ".join(f"{name} {n}" for name, n in counts.items())
    return Result(
        ok(all(n == 0 for n in counts.values())), measured, f"{note} {first}"[:200], values
    )
