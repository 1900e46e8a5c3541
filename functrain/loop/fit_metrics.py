"""What `fit` measures beside the step: the train metrics, updated from the step's outputs, and
the evaluation sets, each rank evaluating its part and a set with no batch on any rank refused.

Example:
    >>> check_eval_sets(options.eval_sets, rank=0, world_size=1)   # before training
    >>> results = evaluate_sets(step, state, options, (0, 1, None), emit, ctx)
    >>> results["accuracy"]
    0.93
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..data import place
from .evaluation import describe_batch, run_eval
from .events import Context, Event
from .options import FitOptions

__all__ = ["check_eval_sets", "evaluate_sets", "update_train_metrics"]


def update_train_metrics(options: FitOptions, metrics: Mapping[str, Any], batch: Any) -> None:
    """Update `fit(train_metrics=...)` with the step's outputs and the batch's targets.

    Args:
        options: the run's options (its `train_metrics`, `target_key`).
        metrics: the step's metrics ("outputs", optionally "targets").
        batch: the batch the step trained on (the targets, unless the metrics hold them).
    Raises:
        ValueError: the step returned no outputs, or the batch has no `target_key`.
    Example:
        >>> update_train_metrics(options, {"loss": loss, "outputs": logits}, (x, y))
    """
    if not options.train_metrics:
        return
    outputs = metrics.get("outputs")
    if outputs is None:
        raise ValueError(
            "fit(train_metrics=...) computes the metrics from the step's outputs, but the "
            f"step's metrics have none (keys: {sorted(metrics)}); return them from loss_fn: "
            "`return loss, {'outputs': logits}` (and 'targets' when the batch's "
            "target_key does not hold them)"
        )
    targets = metrics.get("targets")
    if targets is None:
        targets = _batch_item(batch, options.target_key)
    for metric in options.train_metrics.values():
        metric.update(outputs, targets)


def check_eval_sets(eval_sets: Mapping[str | None, Any], rank: int, world_size: int) -> None:
    """An evaluation set with a length of 0 on every rank fails now, not after training.

    Args:
        eval_sets: `FitOptions.eval_sets`.
        rank, world_size: this rank's place among the data-parallel ranks.
    Raises:
        ValueError: a sized set yields no batch on any rank.
    Example:
        >>> check_eval_sets({None: []}, 0, 1)
        Traceback (most recent call last):
        ValueError: eval_data yields no batch (on any rank), ...
    """
    for name, data in eval_sets.items():
        try:
            count = len(place(data, rank, world_size))  # this rank's part
        except TypeError:
            continue  # unsized: checked when evaluated
        _no_eval_batches(name, _sum_over_ranks(count))


def evaluate_sets(
    step: Any,
    state: Any,
    options: FitOptions,
    where: tuple[int, int, torch.device | None],
    emit: Callable[[Event], None],
    ctx: Context,
) -> dict[str, float]:
    """Evaluate `state` on every evaluation set (this rank's part of each).

    Args:
        step: the run's step (its evaluator, unless `options.eval_fn`).
        state: what to evaluate (after `eval_state_fn`).
        options: the run's options (sets, metrics, keys).
        where: `(rank, world_size, device)` of this rank.
        emit: sends the EVAL_* events to the callbacks.
        ctx: the run's context (`ctx.eval_metrics` is updated after each set).
    Returns:
        the metrics, named "<set>/<metric>" for a named set.
    Raises:
        ValueError: a set yielded no batch on any rank.
    """
    rank, world_size, device = where
    results: dict[str, float] = {}
    for name, data in options.eval_sets.items():
        counted = _Counted(place(data, rank, world_size))  # this rank's part
        values = run_eval(
            step,
            state,
            counted,
            metrics=dict(options.eval_metrics),
            eval_fn=options.eval_fn,
            emit=emit,
            ctx=ctx,
            device=device,
            input_key=options.input_key,
            target_key=options.target_key,
        )
        _no_eval_batches(name, _sum_over_ranks(counted.count))
        results.update({(k if name is None else f"{name}/{k}"): v for k, v in values.items()})
        ctx.eval_metrics = dict(results)
    return results


class _Counted:
    """An iterable that counts the batches it yields (to refuse an evaluation of none)."""

    def __init__(self, data: Any):
        self.data, self.count = data, 0

    def __iter__(self):
        for batch in self.data:
            self.count += 1
            yield batch


def _sum_over_ranks(count: int) -> int:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    total = torch.tensor([count], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total)
    return int(total.item())


def _no_eval_batches(name: str | None, total: int) -> None:
    if total == 0:
        which = "eval_data" if name is None else f"eval_data[{name!r}]"
        raise ValueError(
            f"{which} yields no batch (on any rank), so its metrics would be NaN: check the "
            "evaluation set's length, and that a Loader used for it has drop_last=False when "
            "the set is smaller than one batch"
        )


def _batch_item(batch: Any, key: Any) -> Any:
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(
            f"cannot take the targets from a batch that is a {describe_batch(batch)} with key "
            f"{key!r} ({type(error).__name__}: {error}); pass fit(target_key=...), or return "
            "them from loss_fn under 'targets'"
        ) from None
