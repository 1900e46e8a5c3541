"""A LeNet-style CNN on Fashion-MNIST: over 90% test accuracy in 3 epochs on a CPU.

    apt-get install dataset-fashion-mnist            # Debian/Ubuntu: the data, 30 MB
    python examples/fashion_mnist_cnn.py --run-dir runs/fashion   # rerun to resume
    python -m functrain.launch -n 2 examples/fashion_mnist_cnn.py

The images come from Debian's `dataset-fashion-mnist` package (IDX files under
/usr/share/datasets/fashion-mnist); the script says how to install it when it is missing.
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
from torch.utils.data import Subset

import functrain
from functrain import datasets, schedules
from functrain.data import Loader
from functrain.loop import evaluate, fit


def build_model() -> nn.Module:
    """Two 5x5 conv blocks with BatchNorm and pooling, then a 128-unit hidden layer (220k params)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )  # fmt: skip


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = example_parser(__doc__)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    add_run_args(parser, lr=3e-3, quick_help="30 steps, 1,000 test images")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, callbacks=()) -> dict:
    args = parse_args(argv)
    set_threads(args.threads, default=4)  # a 28x28 CNN: a few threads pay off, more only wait
    try:
        split = datasets.fashion_mnist()
    except datasets.DatasetNotFound as error:
        sys.exit(f"fashion_mnist_cnn: {error}")
    mesh = data_parallel_mesh()
    test_set = Subset(split.test, range(1000)) if args.quick else split.test
    train = Loader(split.train, args.batch_size, seed=args.seed)
    test = Loader(test_set, 1000, shuffle=False, drop_last=False)

    torch.manual_seed(args.seed)
    model = build_model()
    lr = args.lr * schedules.cosine_annealing_with_warmup(t_warmup="50ba")
    optimizer = functrain.optim.adamw(lr=lr, weight_decay=1e-4)
    state = functrain.init(model, optimizer, seed=args.seed, mesh=mesh,
                           plan="ddp" if mesh is not None else None)  # fmt: skip
    step = functrain.make_step(model, loss_fn, optimizer)

    from functrain.loggers import ConsoleLogger, ProgressBar

    with resumable_checkpoints(args.run_dir, every="200ba") as checkpoints:
        result = fit(
            step,
            state,
            train,
            duration="30ba" if args.quick else f"{args.epochs}ep",
            eval_data=test,
            eval_metrics=["accuracy"],
            loggers=[ProgressBar(), ConsoleLogger(interval="100ba"), *run_loggers(args.run_dir)],
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
    if functrain.parallel.data_parallel_info(state.layout)[0] == 0:
        print(
            f"fashion-mnist: test accuracy {results['accuracy']:.4f}, loss {results['loss']:.4f} "
            f"after {state.step} steps"
        )
    return {**results, "state": state, "exit_code": result.exit_code}


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
