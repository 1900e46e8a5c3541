"""What the example scripts share: their common flags, the process setup, resumable checkpoints.

Not part of functrain: each example stays a whole recipe (data, model, loss, optimizer, `init`,
`make_step`, `fit`), and this module holds only the plumbing they would otherwise repeat line for
line. The scripts import it as `_common`: their own directory is on `sys.path` both under
`python examples/x.py` and under `python -m functrain.launch -n 2 examples/x.py`.

Example:
    >>> parser = example_parser(__doc__)
    >>> parser.add_argument("--epochs", type=int, default=8)
    >>> add_run_args(parser, lr=1e-2, quick_help="one epoch (a smoke test)")
    >>> args = parser.parse_args(["--quick"])
    >>> with resumable_checkpoints(args.run_dir, every="1ep") as checkpoints:
    ...     state = fit(step, state, train, duration="1ep", checkpoints=checkpoints,
    ...                 autoresume=checkpoints is not None, run_dir=args.run_dir)
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

import functrain


def example_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by the first line of the script's docstring."""
    return argparse.ArgumentParser(description=doc.split("\n")[0])


def add_run_args(parser: argparse.ArgumentParser, *, lr: float, quick_help: str) -> None:
    """Add the flags every training example ends with: `--lr` to `--quick`.

    The scripts add their own flags (length, batch size, model shape) first, so `--help` lists
    those before these.

    Args:
        parser: the script's parser.
        lr: the default of `--lr`.
        quick_help: what `--quick` (the script's smoke-test mode) does.
    """
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=None, help="checkpoints here; a rerun resumes")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true", help=quick_help)


def set_threads(threads: int | None) -> None:
    """Set torch's intra-op threads when `--threads` was given (the tests use one)."""
    if threads:
        torch.set_num_threads(threads)


def data_parallel_mesh() -> Any:
    """A data-parallel mesh under `functrain.launch` / torchrun, else None (one process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return functrain.parallel.init_mesh()
    return None


def run_loggers(run_dir: str | None) -> list[Any]:
    """The loggers that keep a run's curves: a JSONL log in `<run_dir>/metrics.jsonl` (what
    `python -m functrain.plot RUN_DIR` draws); none without a run directory.

    Pass `fit(..., run_dir=run_dir)` too: the logger finds its directory there.
    """
    if not run_dir:
        return []
    from functrain.loggers import JSONLLogger

    return [JSONLLogger()]


@contextlib.contextmanager
def resumable_checkpoints(run_dir: str | None, every: str) -> Iterator[Any]:
    """A checkpoint `Manager` in `<run_dir>/checkpoints` keeping the last two, closed on exit.

    Args:
        run_dir: the run directory (`--run-dir`); None: no checkpoints (yields None).
        every: how often to save ("1ep", "200ba").
    Returns:
        a context manager yielding the `Manager` or None; pass it to `fit(checkpoints=...)` with
        `autoresume=checkpoints is not None`, so that a rerun of the script resumes.
    """
    if not run_dir:
        yield None
        return
    from functrain.checkpoint import Manager

    checkpoints = Manager(os.path.join(run_dir, "checkpoints"), every=every, keep_last=2)
    try:
        yield checkpoints
    finally:
        checkpoints.close()  # waits for an asynchronous save in flight
