"""Skipped steps on several ranks, for tests/test_step_skip.py (run on every rank).

`python -m functrain.launch -n 2 tests/step_skip_worker.py --out r.json --plans ddp fsdp` trains with
`skip_nonfinite=True` through `fit`, each rank on its slice of the global batches. On two steps
only the *last* rank's slice is bad: once an inf input (every gradient goes non-finite after the
reduction) and once a loss that is NaN with finite gradients (seen by that rank alone). Every rank
must skip both, or replicated parameters would drift apart. The
one-process reference is `train()` in-process on the whole batches. Rank 0 writes each plan's
final parameters as JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import functrain
from functrain import parallel

GRAD_BAD, LOSS_BAD, STEPS, BATCH = 1, 3, 5, 8


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def global_batches() -> list:
    gen = torch.Generator().manual_seed(4)
    out = []
    for step in range(STEPS):
        x = torch.randn(BATCH, 5, generator=gen)
        y = torch.randint(0, 3, (BATCH,), generator=gen)
        flag = torch.zeros(BATCH)
        if step == GRAD_BAD:
            x[-1, 0] = float("inf")  # in the last rank's slice
        if step == LOSS_BAD:
            flag[-1] = 1.0
        out.append((x, y, flag))
    return out


def loss_fn(model, batch):
    x, y, flag = batch
    # NaN when this slice holds a flagged sample; no gradient flows through the flag
    bad = torch.where(flag.sum() > 0, torch.tensor(float("nan")), torch.tensor(0.0))
    return F.cross_entropy(model(x), y) + bad


class Skips:
    def __init__(self):
        self.skipped = []

    def batch_end(self, ctx):
        self.skipped.append(bool(ctx.metrics["skipped"]))


def train(mesh=None, plan=None) -> dict:
    """Train on this rank's slice (the whole batches without a mesh); the run's outcome."""
    model = net()
    opt = functrain.optim.adamw(lr=1e-2)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
    rank, world = parallel.data_parallel_info(state.layout)
    step = functrain.make_step(model, loss_fn, opt, skip_nonfinite=True)
    share = BATCH // world
    data = [tuple(t[rank * share : (rank + 1) * share] for t in b) for b in global_batches()]
    skips = Skips()
    final = functrain.fit(
        step, state, data, duration=f"{STEPS}ba", eval_interval=None, callbacks=[skips]
    )
    full = parallel.full_params(final.params)
    return {
        "skipped": skips.skipped,
        "params": {k: v.tolist() for k, v in full.items()},
        "step": final.step,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--plans", nargs="+", default=["ddp", "fsdp"])
    args = parser.parse_args()
    rank, _ = parallel.init_distributed(timeout_s=120)
    mesh = parallel.init_mesh()
    results = {plan: train(mesh, plan) for plan in args.plans}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    parallel.shutdown()


if __name__ == "__main__":
    main()
