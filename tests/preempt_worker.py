"""A small run that the preemption tests stop with signals, alone or under the launcher.

    python tests/preempt_worker.py --root R --out O [--steps 200] [--pace 0.02] [--slow-batch 0]
    python -m functrain.launch -n 2 tests/preempt_worker.py --root R --out O

Each rank writes `O/pid.<rank>` when training starts and `O/result.<rank>.json` (step,
preempted, signal, checkpoint, stop reason) when `fit` returns, then exits with
`FitResult.exit_code` (75 after SIGTERM, 130 after Ctrl-C), as a script should. It installs its
own (do-nothing) SIGTERM handler first: `fit` must restore it when it returns, and it keeps a
second SIGTERM that arrives after `fit` returned from killing the rank before it has reported.
"""

import argparse
import json
import os
import pathlib
import signal
import sys
import time

import torch
import torch.nn.functional as F

import functrain
from functrain.checkpoint import Manager
from functrain.data import Loader


class Pace:
    """Writes the pid file at FIT_START; slows every batch (and one batch a lot, if asked)."""

    def __init__(self, out: pathlib.Path, rank: int, pace: float, slow_batch: int):
        self.out, self.rank, self.pace, self.slow_batch = out, rank, pace, slow_batch

    def fit_start(self, ctx):
        (self.out / f"pid.{self.rank}").write_text(str(os.getpid()))

    def batch_start(self, ctx):
        if self.slow_batch and ctx.timestamp.batch == self.slow_batch - 1:
            (self.out / f"slow.{self.rank}").touch()
            time.sleep(30)  # a long step: time for a second Ctrl-C before the boundary

    def batch_end(self, ctx):
        time.sleep(self.pace)


def loss_fn(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--slow-batch", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    late = []
    signal.signal(signal.SIGTERM, lambda signum, frame: late.append(signum))
    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    mesh = functrain.parallel.init_mesh() if multi else None
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    data = torch.utils.data.TensorDataset(x, x @ torch.ones(4, 1))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = functrain.optim.adamw(lr=1e-2)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan="ddp" if multi else None)
    rank = functrain.parallel.data_parallel_info(state.layout)[0]
    step = functrain.make_step(model, loss_fn, opt)
    with Manager(args.root, every="5ba", keep_last=2) as manager:
        result = functrain.fit(
            step,
            state,
            Loader(data, 8, seed=0),
            duration=f"{args.steps}ba",
            callbacks=[Pace(out, rank, args.pace, args.slow_batch)],
            checkpoints=manager,
            autoresume=True,
            log_interval=None,
            return_result=True,
        )
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # ours came back
    report = {
        "step": result.state.step,
        "preempted": result.preempted,
        "signal": result.signal,
        "finished": result.finished,
        "checkpoint": result.checkpoint,
        "stop_reason": result.stop_reason,
    }
    (out / f"result.{rank}.json").write_text(json.dumps(report))
    if multi:
        torch.distributed.barrier()  # both reported before either exits (torchrun stops all)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
