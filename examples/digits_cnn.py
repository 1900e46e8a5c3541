"""A small CNN on scikit-learn's handwritten digits: about 98% test accuracy in a few seconds.

    python examples/digits_cnn.py                            # one process
    python examples/digits_cnn.py --run-dir runs/digits      # checkpoints; rerun to resume
    python -m functrain.launch -n 2 examples/digits_cnn.py   # two processes, data parallel

The data (1,797 8x8 images) ships with scikit-learn, so nothing is downloaded. The script is the
whole recipe: a model, a loss, an optimizer with a schedule, `functrain.init`, `make_step`, and
`fit` with evaluation, a progress bar and (with --run-dir) auto-resuming checkpoints.

On two processes each rank normalises its own half of a batch, so the run is close to, not
equal to, the one-process run (the BatchNorm buffers are kept identical across ranks, so a
stopped and resumed run equals an uninterrupted one); `functrain.parallel.sync_batchnorm`
makes it equal (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _common import (
    add_run_args,
    data_parallel_mesh,
    example_parser,
    resumable_checkpoints,
    run_loggers,
    set_threads,
    stopped,
)
from torch import nn

import functrain
from functrain import datasets, schedules
from functrain.data import Loader
from functrain.loop import evaluate, fit


def build_model(width: int = 16) -> nn.Module:
    """Three 3x3 conv layers with BatchNorm, two poolings, a linear head (8.5k parameters)."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 2 * 2, 10),
    )  # fmt: skip


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    """Cross-entropy of the model's logits on an `(images, labels)` batch."""
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = example_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    add_run_args(parser, lr=1e-2, quick_help="one epoch (a smoke test)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, callbacks=()) -> dict:
    args = parse_args(argv)
    set_threads(args.threads, default=1)  # 8.5k parameters: more threads only wait
    mesh = data_parallel_mesh()
    split = datasets.digits(seed=0)
    train = Loader(split.train, args.batch_size, seed=args.seed)
    test = Loader(split.test, 512, shuffle=False, drop_last=False)

    torch.manual_seed(args.seed)  # the initial weights
    model = build_model()
    lr = args.lr * schedules.cosine_annealing_with_warmup(t_warmup="10ba")
    optimizer = functrain.optim.adamw(lr=lr, weight_decay=1e-4)
    state = functrain.init(model, optimizer, seed=args.seed, mesh=mesh,
                           plan="ddp" if mesh is not None else None)  # fmt: skip
    step = functrain.make_step(model, loss_fn, optimizer)

    from functrain.loggers import ConsoleLogger, ProgressBar

    with resumable_checkpoints(args.run_dir, every="1ep") as checkpoints:
        result = fit(
            step,
            state,
            train,
            duration=f"{1 if args.quick else args.epochs}ep",
            eval_data=test,
            eval_metrics=["accuracy"],
            loggers=[ProgressBar(), ConsoleLogger(), *run_loggers(args.run_dir)],
            log_interval="1ep",
            checkpoints=checkpoints,
            callbacks=list(callbacks),
            autoresume=checkpoints is not None,
            run_dir=args.run_dir,
            return_result=True,
        )
    state = result.state
    if stopped(result, args.run_dir):  # a stopped run reports no result: it has not finished
        return {"state": state, "exit_code": result.exit_code}
    results = evaluate(step, state, test, metrics=["accuracy"])
    rank, _ = functrain.parallel.data_parallel_info(state.layout)
    if rank == 0:
        print(
            f"digits: test accuracy {results['accuracy']:.4f}, loss {results['loss']:.4f} "
            f"after {state.timestamp.epoch} epochs ({state.step} steps)"
        )
    return {**results, "state": state, "exit_code": result.exit_code}


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
