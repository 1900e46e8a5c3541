"""BatchNorm on 2 ranks, on the digits CNN of examples/digits_cnn.py (issue 30.1), run on every rank.

    python -m functrain.launch -n 2 tests/parallel/batchnorm_worker.py --out r.json --dir D

- `resume`: the example itself (`digits_cnn.main`, 2 epochs) run whole, and run again asked to
  stop at batch 5 (the ranks agree on a stop a few batches later) and rerun (the same command
  resumes): the resumed run's final evaluation, parameters and
  running statistics equal the uninterrupted run's exactly.
- `sync`: the example's CNN made `sync_batchnorm`, trained 2-rank DDP on half the global batch
  each, equals one process on the global batch (within 1e-5), parameters and running statistics.

- `resume_no_broadcast`: `resume` with the per-step broadcast of buffers (the fix of issue 30.1)
  turned off, to show that its check then fails: rank 1 evaluates with statistics its checkpoint
  does not hold. (`--no-broadcast` turns the broadcast off for every scenario.)

All three run in one launch (each launch costs every rank a fresh torch and functrain import).
Rank 0 writes `{scenario: numbers}` as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

import torch
import torch.nn.functional as F
from parallel_launching import finish_worker

import functrain
from functrain import datasets
from functrain import parallel as fdist

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples")
SYNC_STEPS = 8
SYNC_BATCH = 32  # global


def digits_example():
    """examples/digits_cnn.py as a module (its `_common` beside it)."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module("digits_cnn")


class StopAt:
    """Ask `fit` to stop at the end of batch `at` (it checkpoints there, as after SIGTERM)."""

    def __init__(self, at: int):
        self.at = at

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.at:
            ctx.request_stop(f"test stop at batch {self.at}")


def gathered(tensors: dict) -> list[dict]:
    """Every rank's copy of `tensors` (plain tensors), in rank order."""
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, {k: v.tolist() for k, v in tensors.items()})
    return out


def leaves(state) -> dict:
    """The state's parameters (whole) and buffers, as plain tensors."""
    return {**fdist.full_params(state.params), **state.buffers}


@contextlib.contextmanager
def without_buffer_broadcast():
    """Each rank keeps its own running statistics, as before the fix of issue 30.1."""
    from functrain.parallel import buffers

    broadcast = buffers.broadcast_buffers
    buffers.broadcast_buffers = lambda b, layout: b
    try:
        yield
    finally:
        buffers.broadcast_buffers = broadcast


def scenario_resume_no_broadcast(work: str) -> dict:
    with without_buffer_broadcast():
        return scenario_resume(work)


def scenario_resume(work: str) -> dict:
    digits = digits_example()
    common = ["--epochs", "2", "--threads", "1"]
    whole = digits.main([*common, "--run-dir", os.path.join(work, "whole")])
    resumed_dir = os.path.join(work, "resumed")
    stopped = digits.main([*common, "--run-dir", resumed_dir], callbacks=[StopAt(5)])
    again = digits.main([*common, "--run-dir", resumed_dir])
    a, b = leaves(whole["state"]), leaves(again["state"])
    # evaluation on each rank's own half of the test set, with each rank's running statistics:
    # the numbers the issue's user saw differ when rank 1's statistics are not rank 0's
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model, images = digits.build_model(), datasets.digits(seed=0).test.tensors[0]
    own = images[rank::world]
    outs = {}
    for name, state in (("whole", whole["state"]), ("resumed", again["state"])):
        weights = {**fdist.full_params(state.params), **state.buffers}
        model.load_state_dict({k: v.detach().clone() for k, v in weights.items()})
        with torch.no_grad():
            outs[name] = model.eval()(own)
    local_diff = float((outs["whole"] - outs["resumed"]).abs().max())
    buffers = gathered({k: v for k, v in whole["state"].buffers.items() if v.is_floating_point()})
    return {
        "stopped_step": int(stopped["state"].step),
        "steps": [int(whole["state"].step), int(again["state"].step)],
        "accuracy": [whole["accuracy"], again["accuracy"]],
        "loss": [whole["loss"], again["loss"]],
        "leaf_diff": max(float((a[k].float() - b[k].float()).abs().max()) for k in a),
        "local_eval_diff": max(gathered({"d": torch.tensor(local_diff)})[r]["d"] for r in (0, 1)),
        "ranks_buffers_equal": all(b == buffers[0] for b in buffers),
        "names": sorted(a),
    }


def scenario_sync(work: str) -> dict:
    digits = digits_example()
    # SGD, not the example's AdamW: a conv bias before a BatchNorm has an exact gradient of 0,
    # and Adam would scale the rounding noise around 0 into full-size steps that differ by run
    opt = functrain.optim.sgd(0.05, momentum=0.9)
    split = datasets.digits(seed=0)
    images, labels = split.train.tensors
    batches = [
        (
            images[i * SYNC_BATCH : (i + 1) * SYNC_BATCH],
            labels[i * SYNC_BATCH : (i + 1) * SYNC_BATCH],
        )
        for i in range(SYNC_STEPS)
    ]

    def loss_fn(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    expected = None
    if torch.distributed.get_rank() == 0:  # one process on the global batch
        torch.manual_seed(0)
        model = digits.build_model()
        state = functrain.init(model, opt, seed=0, plan="local")
        step = functrain.make_step(model, loss_fn, opt)
        for batch in batches:
            state, _ = step(state, batch)
        expected = leaves(state)
    mesh = fdist.init_mesh()
    torch.manual_seed(0)
    model = fdist.sync_batchnorm(digits.build_model(), mesh)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan="ddp")
    step = functrain.make_step(model, loss_fn, opt)
    rank, dp = fdist.data_parallel_info(state.layout)
    per = SYNC_BATCH // dp
    for x, y in batches:
        state, _ = step(state, (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]))
    got = leaves(state)
    error = None
    if expected is not None:
        error = max(float((got[k].float() - expected[k].float()).abs().max()) for k in expected)
    moved = float(max(v.abs().max() for k, v in got.items() if "running_mean" in k))
    return {"max_error": error, "moved": moved, "names": sorted(got)}


SCENARIOS = {
    "resume": scenario_resume,
    "sync": scenario_sync,
    "resume_no_broadcast": scenario_resume_no_broadcast,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--no-broadcast", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rank, _ = fdist.init_distributed(timeout_s=120)
    results = {}
    with without_buffer_broadcast() if args.no_broadcast else contextlib.nullcontext():
        for name, fn in SCENARIOS.items():
            if not args.only or name in args.only:
                results[name] = fn(os.path.join(args.dir, name))
    return finish_worker(rank, args.out, results)


if __name__ == "__main__":
    sys.exit(main())
