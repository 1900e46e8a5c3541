"""The evaluation sanity check: a few eval batches before training, so a broken eval fails now.

An evaluation that cannot run (a wrong `target_key`, an `eval_fn` that raises, a metric that
does not take the outputs) would otherwise fail only at the first evaluation, an epoch or hours
into the run. At a fresh start `fit` evaluates the first `sanity_check_batches` batches (2 by
default, as Lightning's `num_sanity_val_steps`) of each eval set. The check changes nothing of
the run: the state is only read, the metrics are copies, torch's global generators are restored
after it, and it emits no event and logs nothing. A resumed run skips it.

Example:
    >>> sanity_check(step, state, options, (rank, world_size, device), fresh=True)
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import types
from collections.abc import Iterator
from typing import Any

import torch

from ..data.loader import place
from .evaluation import run_eval
from .options import FitOptions

__all__ = ["SanityCheckError", "sanity_check"]


class SanityCheckError(RuntimeError):
    """The evaluation failed on the sanity check's batches before training; see `__cause__`."""


def sanity_check(
    step: Any,
    state: Any,
    options: FitOptions,
    where: tuple[int, int, torch.device | None],
    fresh: bool,
) -> None:
    """Evaluate the first `options.sanity_check_batches` batches of each eval set, quietly.

    Args:
        step: the run's step (its evaluator, unless `options.eval_fn`).
        state: the step's state. `options.eval_state_fn` is not applied: it chooses the weights
            an evaluation reports (EMA, SWA), and user code may count its calls.
        options: the run's options.
        where: `(rank, world_size, device)` of this rank.
        fresh: whether the run starts at step 0 (a resumed run is not checked again).
    Raises:
        SanityCheckError: the evaluation raised (its error is the `__cause__`).
    """
    count = options.sanity_check_batches
    if not (fresh and count and options.eval_sets):
        return
    rank, world_size, device = where
    # run_eval's own bookkeeping goes to this stand-in, not to the run's context
    quiet = types.SimpleNamespace(rank=rank, world_size=world_size)
    for name, data in options.eval_sets.items():
        placed = place(data, rank, world_size)
        if isinstance(placed, Iterator):
            continue  # a one-shot iterator: checking it would use up its batches
        which = "eval_data" if name is None else f"eval_data[{name!r}]"
        with _restored_rng(device):
            batches = list(itertools.islice(placed, count))
            if world_size > 1:  # the same count on every rank (an eval may be collective)
                batches = batches[: _fewest_over_ranks(len(batches))]
            if not batches:
                continue  # an empty set: the evaluation itself says so
            try:
                run_eval(
                    step,
                    state,
                    batches,
                    metrics={k: copy.deepcopy(m) for k, m in options.eval_metrics.items()},
                    eval_fn=options.eval_fn,
                    emit=lambda event: None,
                    ctx=quiet,
                    device=device,
                    input_key=options.input_key,
                    target_key=options.target_key,
                )
            except Exception as error:
                raise SanityCheckError(
                    f"the evaluation failed in fit's sanity check (the first {len(batches)} "
                    f"batches of {which}, evaluated before training so that a broken evaluation "
                    f"fails now and not at the first evaluation): {type(error).__name__}: "
                    f"{error}. Fix the evaluation (eval_fn, eval_metrics, input_key/target_key, "
                    "the eval data), or pass fit(sanity_check_batches=0) to skip the check"
                ) from error


@contextlib.contextmanager
def _restored_rng(device: torch.device | None):
    """torch's global generators as they were before (an eval DataLoader draws its seed)."""
    cuda = device is not None and device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        yield


def _fewest_over_ranks(count: int) -> int:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    fewest = torch.tensor([count], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        fewest = fewest.cuda()
    dist.all_reduce(fewest, op=dist.ReduceOp.MIN)
    return int(fewest.item())
