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
    >>> set_threads(args.threads, default=1)
    >>> with resumable_checkpoints(args.run_dir, every="1ep") as checkpoints:
    ...     result = fit(step, state, train, duration="1ep", checkpoints=checkpoints,
    ...                  autoresume=checkpoints is not None, run_dir=args.run_dir,
    ...                  return_result=True)
    >>> if stopped(result, args.run_dir):   # "stopped at step N; run the same command again ..."
    ...     sys.exit(result.exit_code)
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
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads (default: OMP_NUM_THREADS, else a count fit for the model)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help=quick_help)


def set_threads(threads: int | None, default: int) -> None:
    """Set torch's intra-op threads: `--threads`, else `OMP_NUM_THREADS` when it is set (torch
    reads it; `functrain.launch` sets it per rank), else `min(default, CPU count)`.

    torch's own default (every core) makes a small model slower, not faster, on a shared machine:
    the threads' synchronisation costs more than their share of a tiny batch, and on a loaded
    machine they wait for each other. So each example names a default for its size (1 for the
    8x8-digit models).

    Args:
        threads: the `--threads` flag, or None.
        default: the example's thread count when neither `--threads` nor OMP_NUM_THREADS is set.
    """
    if threads:
        torch.set_num_threads(threads)
    elif not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(max(1, min(default, os.cpu_count() or 1)))


def rank() -> int:
    """This process's global rank under `functrain.launch` / torchrun (0 in one process)."""
    return int(os.environ.get("RANK", "0"))


def stopped(result: Any, run_dir: str | None) -> bool:
    """Whether `fit`'s run stopped before its end; if so, say (on rank 0) how to continue.

    A stopped run must not look finished: the script then skips its result line and exits with
    `result.exit_code` (75 after SIGTERM, 130 after Ctrl-C).

    Args:
        result: the `FitResult` of `fit(..., return_result=True)`.
        run_dir: `--run-dir` (None: the run kept no checkpoint to continue from).
    Returns:
        True when the run did not finish.
    """
    if result.finished:
        return False
    if rank() == 0:
        why = f" ({result.stop_reason})" if result.stop_reason else ""
        if run_dir:
            how = "run the same command again to continue"
        else:
            how = "no checkpoint was kept; add --run-dir DIR to make a run resumable"
        print(f"stopped at step {result.state.step}{why}; {how}", flush=True)
    return True


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
