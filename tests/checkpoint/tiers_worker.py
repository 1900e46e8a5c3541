"""Ranks of test_checkpoint_tiers.py's multi-process tests (gloo, forked so torch loads once).

    python tiers_worker.py ROOT LOCAL OUT RENDEZVOUS [--crash-at N]
        [--rollback [--every K] [--clean]]

Two ranks, each on its own simulated node: rank r's local tier is LOCAL/node<r> and its replica
goes to the other node's folder. A DDP run of 20 batches saves to ROOT every 10 batches and to
the local tier every 3; with --crash-at N rank 1 SIGKILLs itself at the end of batch N (the
other rank fails in its next collective and the parent stops it). Each rank that finishes
writes OUT/rank<r>.json: where it resumed from and its final parameters as exact hex floats.

With --rollback each rank trains on a list of 60 batches of its own, under `rollback_guard`;
rank 1's batch 39 spikes the loss (its targets x1000), so the mean loss spikes on both ranks
and both skip it (the root saves every 25 batches then). With --every K the guard keeps a snapshot every K batches and skips the range
from the newest one (after batch 32 for K=8) to 39. --clean removes the batches the guard skips
from both ranks' lists (the data that never held them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

import functrain
from functrain.algorithms import rollback_guard, skipped_batches
from functrain.checkpoint import Manager
from functrain.checkpoint.tiers import LocalTier
from functrain.data import Loader

STEPS = 20
SPIKE = 39


def rank_batches(rank: int, clean: bool, every: int) -> list:
    generator = torch.Generator().manual_seed(100 + rank)
    out = []
    for i in range(60):
        x = torch.randn(8, 4, generator=generator)
        y = x @ torch.ones(4, 1)
        if clean and (SPIKE // every) * every <= i <= SPIKE:
            continue
        out.append((x, y * 1000.0 if i == SPIKE and rank == 1 else y))
    return out


class CrashAt:
    def __init__(self, batch: int, rank: int, manager):
        self.batch, self.rank, self.manager = batch, rank, manager

    def batch_end(self, ctx):
        if self.rank == 1 and ctx.timestamp.batch == self.batch:
            # Killed once its asynchronous snapshot of the batch before is committed (one still
            # being written when the process dies is not, and the restart takes an older one).
            self.manager.wait()
            os.kill(os.getpid(), signal.SIGKILL)


def loss_fn(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def exact(state) -> dict:
    return {
        name: [float(v).hex() for v in tensor.detach().full_tensor().flatten().tolist()]
        if hasattr(tensor, "full_tensor")
        else [float(v).hex() for v in tensor.detach().flatten().tolist()]
        for name, tensor in state.params.items()
    }


def run_rank(rank: int, args) -> None:
    dist.init_process_group("gloo", init_method=f"file://{args.rendezvous}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "resuming list")  # a list of batches resumes by replaying
    try:
        mesh = functrain.parallel.init_mesh()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=generator)
        data = torch.utils.data.TensorDataset(x, x @ torch.ones(4, 1))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = functrain.optim.adamw(lr=1e-2)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan="ddp")
        step = functrain.make_step(model, loss_fn, opt)
        train, duration = Loader(data, 8, seed=0), f"{STEPS}ba"
        if args.rollback:
            step = functrain.compose(step, rollback_guard(factor=5.0, every=args.every))
            train = rank_batches(rank, args.clean, args.every)
            duration = f"{len(train)}ba"
        nodes = [os.path.join(args.local, f"node{r}") for r in range(2)]
        local = LocalTier(nodes[rank], every=3, peer=nodes[1 - rank], keep_last=2)
        # Under --rollback the root saves every 25 batches: a crash at 41 or 44 then resumes
        # from the local tier (39, 42) whatever the timing of the root's asynchronous save.
        every = "25ba" if args.rollback else "10ba"
        with Manager(args.root, every=every, keep_last=2, local=local) as manager:
            callbacks = [CrashAt(args.crash_at, rank, manager)] if args.crash_at else []
            result = functrain.fit(step, state, train, duration=duration,
                                   callbacks=callbacks, checkpoints=manager, autoresume=True,
                                   log_interval=None, progress=False, return_result=True)  # fmt: skip
            local_after = sorted(os.listdir(nodes[rank])) if os.path.isdir(nodes[rank]) else []
        dist.barrier()  # both closed: each removed its snapshots and its replica
        seen = {
            "resumed_from": result.resumed_from,
            "step": result.state.step,
            "params": exact(result.state),
            "skipped": skipped_batches(result.state),
            "local_before_close": local_after,
            "local_after_close": os.listdir(nodes[rank]) if os.path.isdir(nodes[rank]) else [],
        }
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)
    finally:
        functrain.parallel.shutdown()  # not a bare destroy: see test_torch_private


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("root", "local", "out", "rendezvous"):
        parser.add_argument(name)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--rollback", action="store_true")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--clean", action="store_true")
    args = parser.parse_args()
    children = []
    for rank in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run_rank(rank, args)
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
