"""Checkpoints in tiers: the local tier's save time, and the steps lost per preemption.

Two measurements, part of `python -m bench checkpoint` (or alone: `python bench/checkpoint_tiers.py`):

1. The time `Manager(local=LocalTier(...))` spends on one local snapshot of the bench's state:
   the rank's own copy alone, and with the replica to a peer's folder (here a second folder on
   the same machine: on a cluster it is another node's storage); synchronous (`async_save=False`)
   and asynchronous (the default: the time the step is blocked, and until both copies are
   committed). Written to `/dev/shm` when it is there (a node's usual local tier), else to the
   bench's work folder.
2. A real `fit` (a small MLP) that is preempted -- a hard stop, no final checkpoint, as a
   SIGKILL -- every `M` executed steps and restarted with `autoresume=True`, until it completes
   its steps: once with root saves every `K` steps only, once with a local tier every `k` steps
   as well. Steps lost per preemption = the step it reached minus the step it resumed from.
   Saves are synchronous there, so a save in flight at the stop is never counted as saved.

Run:
    python bench/checkpoint_tiers.py [--mb 100] [--reps 5] [--steps 400] [--root-every 50]
        [--local-every 5] [--preempt-every 77]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as `python bench/checkpoint_tiers.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import functrain  # noqa: E402
from bench.common import markdown_table  # noqa: E402
from functrain.checkpoint import Manager  # noqa: E402
from functrain.checkpoint.tiers import LocalTier, Tiers  # noqa: E402
from functrain.data import Loader  # noqa: E402

DEFAULTS = dict(steps=400, root_every=50, local_every=5, preempt_every=77)
SAVE_ROWS = {
    "sync_own": "synchronous, own snapshot",
    "sync_own_and_replica": "synchronous, own + peer replica",
    "async_own": "asynchronous, own snapshot",
    "async_own_and_replica": "asynchronous, own + peer replica",
}


def local_folder(workdir: str) -> str:
    """A fresh folder for the local tier: under /dev/shm when writable, else under `workdir`."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else workdir
    return tempfile.mkdtemp(prefix="functrain-bench-tier-", dir=base)


def measure_local_save(state, workdir: str, reps: int) -> dict:
    """Seconds per local snapshot of `state`: own copy only / with the peer's replica, written
    synchronously / asynchronously (then the step's blocked time and the time to the commit)."""
    folder = local_folder(workdir)
    out: dict = {"folder": folder}
    users = {}
    for name in SAVE_ROWS:
        sub = os.path.join(folder, name)
        peer = os.path.join(sub, "peer") if "replica" in name else None
        tier = LocalTier(os.path.join(sub, "own"), every=1, peer=peer, keep_last=1,
                         async_save=name.startswith("async"))  # fmt: skip
        users[name] = Tiers(tier, rank=0, owner="bench")
        users[name].open()
        out[name], out[name + "_committed"] = [], []
    try:
        for rep in range(reps + 1):  # the first save of each makes its folders and buffers
            for name, tier in users.items():
                start = time.perf_counter()
                tier.save(state, step=rep + 1, batch=rep + 1)
                blocked = time.perf_counter() - start
                tier.wait()
                if rep:
                    out[name].append(blocked)
                    out[name + "_committed"].append(time.perf_counter() - start)
    finally:
        for tier in users.values():
            tier.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def _loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


class _Preempt:
    """Stops the attempt after `after` executed steps (as a preemption would, without saving)."""

    def __init__(self, after: int):
        self.after, self.done, self.reached, self.start = after, 0, None, None

    def batch_end(self, ctx):
        if self.start is None:
            self.start = ctx.timestamp.batch - 1  # the step this attempt resumed from
        self.done += 1
        if self.done == self.after:
            self.reached = ctx.timestamp.batch
            raise RuntimeError("simulated preemption")


def simulate(workdir: str, *, local_every: int | None, steps: int, root_every: int,
             preempt_every: int) -> dict:  # fmt: skip
    """Run `steps` steps of a small fit, preempted every `preempt_every` executed steps.

    Returns:
        `{"preemptions", "lost" (per preemption), "executed", "steps", "seconds"}`.
    """
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    base = tempfile.mkdtemp(prefix="functrain-bench-preempt-", dir=workdir)
    local = local_folder(workdir)
    tier = None
    if local_every is not None:
        tier = LocalTier(os.path.join(local, "node0"), every=local_every,
                         peer=os.path.join(local, "node1"), async_save=False)  # fmt: skip
    lost, executed, reached = [], 0, None
    start = time.perf_counter()
    try:
        for _ in range(10 * steps // preempt_every + 10):  # bounded: a run that cannot finish
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                        torch.nn.Linear(32, 1))  # fmt: skip
            opt = functrain.optim.adamw(lr=1e-3)
            step, state = functrain.make_step(model, _loss, opt), functrain.init(model, opt)
            preempt = _Preempt(preempt_every)
            manager = Manager(os.path.join(base, "root"), every=f"{root_every}ba",
                              keep_last=2, async_save=False, local=tier)  # fmt: skip
            try:
                result = functrain.fit(
                    step, state, Loader(data, 16, seed=1), duration=f"{steps}ba",
                    checkpoints=manager, autoresume=True, callbacks=[preempt],
                    progress=False, return_result=True,
                )  # fmt: skip
            except functrain.CallbackError:
                result = None
                manager.close(keep_local=True)  # a preempted node keeps its local storage
            else:
                manager.close()
            if reached is not None:  # the previous attempt's loss: reached -> resumed from
                lost.append(reached - (preempt.start if preempt.start is not None else steps))
            executed += preempt.done
            reached = preempt.reached
            if result is not None:
                break
        else:
            raise RuntimeError(
                f"the run never finished: preempted every {preempt_every} steps, it loses "
                f"them all (saves every {root_every}); choose --preempt-every > --root-every"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    return {
        "preemptions": len(lost),
        "lost": lost,
        "mean_lost": statistics.mean(lost) if lost else 0.0,
        "executed": executed,
        "steps": steps,
        "seconds": time.perf_counter() - start,
    }


def measure(state, workdir: str, reps: int, **settings) -> dict:
    """Both measurements (see the module's docstring); `settings` override `DEFAULTS`."""
    settings = {**DEFAULTS, **settings}
    sim = {k: settings[k] for k in ("steps", "root_every", "preempt_every")}
    return {
        "settings": settings,
        "local_save_s": measure_local_save(state, workdir, reps),
        "root_only": simulate(workdir, local_every=None, **sim),
        "with_local": simulate(workdir, local_every=settings["local_every"], **sim),
    }


def tables(report: dict, mb: float) -> str:
    """The two tables of `measure`'s report, in markdown."""
    saves = report["local_save_s"]
    rows = []
    for name, label in SAVE_ROWS.items():
        blocked = statistics.median(saves[name])
        committed = statistics.median(saves[name + "_committed"])
        rows.append([f"local tier save: {label}", blocked, committed, mb / committed])
    s = report["settings"]
    lost_rows = []
    for name, label in (
        ("root_only", f"root every {s['root_every']} steps"),
        ("with_local", f"root every {s['root_every']} + local every {s['local_every']}"),
    ):
        r = report[name]
        overhead = r["executed"] / r["steps"] - 1
        lost_rows.append([label, r["preemptions"], r["mean_lost"], r["executed"], overhead])
    where = "/dev/shm" if saves["folder"].startswith("/dev/shm") else saves["folder"]
    return "\n\n".join([
        f"local tier ({where}, the {mb:.0f} MB state):\n"
        + markdown_table(["save", "step blocked s", "until committed s", "MB/s"], rows),
        f"{s['steps']} steps, preempted every {s['preempt_every']} executed steps:\n"
        + markdown_table(
            ["checkpoints", "preemptions", "steps lost per preemption", "steps run",
             "extra steps (fraction)"],
            lost_rows,
        ),
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench checkpoint_tiers", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--mb", type=float, default=100.0, help="state size in MB (default 100)")
    parser.add_argument("--reps", type=int, default=5)
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    from bench.checkpoint import build_state, tensor_bytes

    state = build_state(args.mb)
    workdir = tempfile.mkdtemp(prefix="functrain-bench-tiers-")
    try:
        settings = {k: getattr(args, k) for k in DEFAULTS}
        report = measure(state, workdir, args.reps, **settings)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(tables(report, tensor_bytes(state) / 2**20))
    return 0


if __name__ == "__main__":
    sys.exit(main())
