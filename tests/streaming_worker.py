"""One run of the Streaming tests: `fit` on MDS shards (a directory or s3://), one or N ranks.

    python tests/streaming_worker.py --remote DIR_OR_URL --cache DIR --out-dir DIR [--kill-at N]
    python -m functrain.launch -n 2 tests/streaming_worker.py ...

Trains a linear classifier on the digits shards (columns x, y, id) for `--duration` with
checkpoints every `--every` and auto-resume. Each rank appends one JSON line per step to
`<run>/ids.<rank>.jsonl`: the step, the process id and the sample ids of its batch (what it read,
so the test can check who read what and that nothing was replayed). With `--kill-at N` every rank
waits for the checkpoint in flight and SIGKILLs itself right after step N. At the end rank 0 writes
the parameters to `<run>/params.safetensors`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import functrain
from functrain.checkpoint import Manager
from functrain.streaming import StreamingData, import_streaming


def loss_fn(model, batch):
    x, y, _ = batch
    return F.cross_entropy(model(x), y)


class Record:
    """Appends what each step read to `<run>/ids.<rank>.jsonl`; SIGKILLs after step `kill_at`."""

    def __init__(self, path: str, kill_at: int, manager: Manager):
        self.file = open(path, "a")  # noqa: SIM115 (closed at exit or lost to SIGKILL on purpose)
        self.kill_at, self.manager = kill_at, manager

    def batch_end(self, ctx):
        ids = ctx.batch[2].tolist()
        ts = ctx.timestamp
        line = {"step": ts.batch, "epoch": ts.epoch, "pid": os.getpid(), "ids": ids}
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()
        if ts.batch == self.kill_at:
            self.manager.wait()  # the last checkpoint is committed; the steps after it are lost
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out-dir", dest="run", required=True)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--duration", default="2ep")
    parser.add_argument("--every", default="10ba")
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    streaming = import_streaming()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    mesh = functrain.parallel.init_mesh() if world > 1 else None
    rank = int(os.environ.get("RANK", "0"))
    remote, local = (args.remote, args.cache) if "://" in args.remote else (None, args.remote)
    dataset = streaming.StreamingDataset(
        remote=remote,
        local=local,
        batch_size=args.global_batch // world,
        shuffle=True,
        shuffle_seed=7,
    )
    data = StreamingData(dataset, columns=("x", "y", "id"))

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    optimizer = functrain.optim.adamw(lr=1e-2)
    state = functrain.init(model, optimizer, seed=0, mesh=mesh, plan="ddp" if mesh else None)
    step = functrain.make_step(model, loss_fn, optimizer)
    manager = Manager(os.path.join(args.run, "ckpt"), every=args.every, keep_last=2)
    os.makedirs(args.run, exist_ok=True)
    record = Record(os.path.join(args.run, f"ids.{rank}.jsonl"), args.kill_at, manager)
    with manager:
        state = functrain.fit(
            step,
            state,
            data,
            duration=args.duration,
            callbacks=[record],
            checkpoints=manager,
            autoresume=True,
            log_interval=None,
        )
    params = {k: getattr(v, "full_tensor", lambda v=v: v)() for k, v in state.params.items()}
    if rank == 0:
        out = os.path.join(args.run, "params.safetensors")
        save_file({k: v.contiguous() for k, v in params.items()}, out)
    if world > 1:
        functrain.parallel.shutdown()


if __name__ == "__main__":
    main()
