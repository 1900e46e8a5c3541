"""A small run for the elastic-resume test: fit + Loader + Manager under a plan, losses to JSON.

    python tests/checkpoint/elastic_worker.py --plan none --steps 16 --run-dir D --out L.json
    python -m functrain.launch -n 4 tests/checkpoint/elastic_worker.py --plan fsdp ...

The same script runs alone or under the launcher; with `--run-dir` it auto-resumes, so a run
started on 4 ranks can be continued on 2 or 3. With `--interrupt crash|sigterm --interrupt-at K`,
the first attempt under torchrun (TORCHELASTIC_RESTART_COUNT=0) raises at step K, or SIGTERMs
itself there and exits with code 75 after fit's preemption checkpoint, so the launcher's
`--max-restarts` starts a second attempt that auto-resumes.
"""

import argparse
import json
import os
import signal
import sys

import torch
import torch.nn.functional as F

import functrain
from functrain import parallel as fdist
from functrain.checkpoint import Manager
from functrain.data import Loader


class LossRecorder:
    """Keeps each step's loss (already averaged over the data-parallel ranks by the step), and
    interrupts the first torchrun attempt at step `at` when asked."""

    def __init__(self, interrupt: str | None = None, at: int = 0):
        self.losses = {}
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
        self.interrupt = interrupt if first_attempt else None
        self.at = at

    def batch_end(self, ctx):
        self.losses[ctx.state.step] = float(ctx.metrics["loss"])
        if self.interrupt is not None and ctx.state.step == self.at:
            if self.interrupt == "crash":
                raise RuntimeError(f"crash at step {self.at} (first attempt)")
            os.kill(os.getpid(), signal.SIGTERM)  # as a preempting scheduler would


def loss_fn(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", default="none")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--interrupt", choices=("crash", "sigterm"), default=None)
    parser.add_argument("--interrupt-at", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(240, 16, generator=generator)
    targets = torch.randint(0, 5, (240,), generator=generator)
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    loader = Loader(dataset, batch_size=24, shuffle=True, seed=0)  # 24: divisible by 2, 3, 4
    torch.manual_seed(0)
    # 13 hidden units: shards are uneven on 2, 3 and 4 ranks.
    model = torch.nn.Sequential(torch.nn.Linear(16, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5))
    optimizer = functrain.optim.adamw(lr=1e-2)
    plan = None if args.plan == "none" else args.plan
    mesh = fdist.init_mesh() if plan else None
    state = functrain.init(model, optimizer, seed=0, mesh=mesh, plan=plan)
    step = functrain.make_step(model, loss_fn, optimizer)
    recorder = LossRecorder(args.interrupt, args.interrupt_at)
    manager = Manager(args.run_dir, every="4ba", keep_last=None, async_save=False)
    state = functrain.fit(
        step,
        state,
        loader,
        duration=f"{args.steps}ba",
        callbacks=[recorder],
        checkpoints=manager,
        autoresume=True,
        log_interval="1ba",
    )
    if fdist.data_parallel_info(state.layout)[0] == 0:
        with open(args.out, "w") as f:
            json.dump(recorder.losses, f)
    if plan:
        fdist.shutdown()
    if state.step < args.steps:  # stopped early by SIGTERM: ask torchrun for a restart
        sys.exit(75)


if __name__ == "__main__":
    main()
