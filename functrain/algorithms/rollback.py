"""Rollback on a loss spike: go back to the newest snapshot, and skip the batches since it.

What the PaLM and OPT logbooks did by hand at 3 a.m. (roll back, skip the batches, go on), as
the step's `guard` piece: when the loss -- already the mean over data-parallel ranks, so every
rank decides alike -- exceeds `factor` times the mean of the last `window` accepted losses (after
`warmup` of them), or is not finite, the update is not applied and the run goes back to its
newest snapshot: the params, buffers and optimizer state (its counters included) as they were
after the last batch whose index is a multiple of `every` (or after the last rollback), with the
loss history of then. Every batch since that snapshot, the spike's included, counts as consumed
and skipped: the run continues exactly as one whose data never held them. `state.step` and the
timestamp still advance (the batches were consumed).

With `every=1` (the default) the snapshot is the state before the spike's batch, which the step
still holds: only that batch is skipped and nothing is copied. With `every=k > 1` the snapshot is
a copy of params, buffers and optimizer state kept in `state.algo_state["rollback"]` and taken
every `k` batches (one more copy of them in memory and in every checkpoint).

Everything the guard decides on and restores -- the snapshot, the loss history, the skipped
ranges -- is in the state, so it checkpoints with it: a run resumed after a rollback knows what
was skipped, and one resumed from a checkpoint before the spike replays the same decision and
rolls back to the same snapshot.

Each rollback is logged (`functrain.rollback` logger: the step, the loss, the skipped range) and
shows as `metrics["skipped"]`. `max_in_a_row` rollbacks in a row stop the run with an error: a
loss that stays high is not a spike, and a person should look. Other algorithms' states (EMA,
SWA, the fp16 loss scale) are not rolled back.

Example:
    >>> step = functrain.compose(functrain.make_step(model, loss_fn, opt),
    ...                          rollback_guard(5.0, every=8))
    >>> skipped_ranges(state)
    [(32, 39)]
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..state import TrainState
from ..step.pieces import Algorithm, StepPieces
from ..tree import tree_map

NAME = "rollback"
logger = logging.getLogger("functrain.rollback")
_RESTORED = ("params", "buffers", "opt_state")  # what a snapshot holds of the state


class LossSpikeError(RuntimeError):
    """The loss spiked `max_in_a_row` steps in a row: not a spike, a derailed run."""


def _copy(tree: Any) -> Any:
    """`tree` with every tensor cloned (a donating step updates the state's tensors in place)."""
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def _snapshot(state: TrainState, current: dict) -> dict:
    """The parts of `state` a rollback restores, copied, with the guard's history of now."""
    snap = {part: _copy(getattr(state, part)) for part in _RESTORED}
    snap["history"] = current["history"].clone()
    snap["accepted"] = current["accepted"].clone()
    snap["batch"] = torch.tensor(state.timestamp.batch, dtype=torch.int64)
    return snap


def rollback_guard(
    factor: float = 5.0,
    *,
    window: int = 20,
    warmup: int = 10,
    max_in_a_row: int = 3,
    capacity: int = 64,
    every: int = 1,
) -> Algorithm:
    """Roll back to the newest snapshot and skip the batches since it when the loss spikes
    above `factor` x its recent mean.

    Compose it last, so that its snapshot and rollback see the step every other algorithm made.

    Args:
        factor: a loss above `factor` times the mean of the recent accepted losses is a spike.
        window: how many of the newest accepted losses make the recent mean.
        warmup: accepted losses needed before finite spikes are judged (non-finite ones always
            are).
        max_in_a_row: this many rollbacks in a row raise `LossSpikeError`.
        capacity: how many skipped ranges the state records (the oldest are dropped).
        every: take a snapshot after every batch whose count is a multiple of this; a spike
            skips every batch since the newest one (1: only the spike's batch, no copy kept).
    Returns:
        the `Algorithm` named "rollback" (state in `algo_state["rollback"]`, exactly resumable).
    Example:
        >>> step = functrain.compose(make_step(model, loss_fn, opt), rollback_guard(4.0, every=50))
    """
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 1):
        raise ValueError(f"rollback_guard(factor=...) must be a finite number > 1, got {factor!r}")
    for name, value in (
        ("window", window),
        ("warmup", warmup),
        ("max_in_a_row", max_in_a_row),
        ("capacity", capacity),
        ("every", every),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"rollback_guard({name}=...) must be a positive int, got {value!r}")

    def init(state: TrainState) -> dict:
        current: dict[str, Any] = {
            "history": torch.zeros(window, dtype=torch.float64),
            "accepted": torch.tensor(0, dtype=torch.int64),
            "streak": torch.tensor(0, dtype=torch.int64),
            "skipped": torch.full((capacity, 2), -1, dtype=torch.int64),  # [first, last] rows
        }
        if every > 1:  # the state the run starts from is the first snapshot
            current["snapshot"] = _snapshot(state, current)
        return current

    def with_current(state: TrainState, current: dict) -> TrainState:
        return state.replace(algo_state={**state.algo_state, NAME: current})

    def decide(loss: float, finite: bool, state: TrainState) -> tuple[TrainState, bool]:
        current = state.algo_state.get(NAME) or init(state)
        accepted = int(current["accepted"])
        recent = current["history"][: min(accepted, window)]
        baseline = float(recent.mean()) if accepted >= warmup else None
        spike = not finite or (baseline is not None and loss > factor * baseline)
        if not spike:
            history = current["history"].clone()
            history[accepted % window] = loss
            new = {**current, "history": history, "accepted": torch.tensor(accepted + 1),
                   "streak": torch.tensor(0)}  # fmt: skip
            return with_current(state, new), False
        streak = int(current["streak"]) + 1
        batch = state.timestamp.batch  # the index of the spike's batch
        first = int(current["snapshot"]["batch"]) if every > 1 else batch
        mean = "(none yet)" if baseline is None else f"{baseline:.6g}"
        if streak >= max_in_a_row:
            raise LossSpikeError(
                f"the loss spiked {streak} steps in a row (now {loss:.6g} at batch {batch}, "
                f"recent mean {mean}): the run is derailed, not hit by one bad batch. "
                "Resume from an earlier checkpoint with a lower learning rate, or raise "
                "rollback_guard(max_in_a_row=...)"
            )
        skipped = torch.cat([current["skipped"][1:], torch.tensor([[first, batch]])])
        where = "the state before it" if first == batch else f"its snapshot after batch {first}"
        logger.warning(
            "functrain.rollback: loss %.6g at step %d (batch %d) exceeds %g x its recent mean "
            "%s; rolled back to %s and skipped batches [%d, %d]",
            loss, state.step + 1, batch, factor, mean, where, first, batch,
        )  # fmt: skip
        new = {**current, "streak": torch.tensor(streak), "skipped": skipped}
        return with_current(state, new), True

    def after(state: TrainState) -> TrainState:
        """Restore the snapshot after a rollback, else take one when it is due."""
        current = state.algo_state.get(NAME)
        if current is None or "snapshot" not in current:
            return state
        batch = state.timestamp.batch
        snap = current["snapshot"]
        if int(current["skipped"][-1, 1]) == batch - 1:  # this step rolled back
            # Copies: the state's tensors are updated in place by a donating step, and the
            # snapshot must stay as it is for a next spike.
            state = state.replace(**{part: _copy(snap[part]) for part in _RESTORED})
            current = {**current, "history": snap["history"].clone(),
                       "accepted": snap["accepted"].clone()}  # fmt: skip
            # The restored state is where the run now stands: a next spike skips from here.
            snap = {**snap, "batch": torch.tensor(batch, dtype=torch.int64)}
            return with_current(state, {**current, "snapshot": snap})
        if batch % every == 0 and batch != int(snap["batch"]):
            return with_current(state, {**current, "snapshot": _snapshot(state, current)})
        return state

    def apply(pieces: StepPieces) -> StepPieces:
        inner, inner_after = pieces.guard, pieces.after_update

        def guard(result, grad_norm, state):
            state, skip = inner(result, grad_norm, state)
            # One host sync per step, as skip_nonfinite: the update must not run at all.
            loss = float(result.loss.detach().float())
            finite = math.isfinite(loss) and bool(torch.isfinite(grad_norm))
            state, spike = decide(loss, finite, state)
            return state, (True if spike else skip)  # (keeps a device-side skip as it is)

        return pieces._replace(guard=guard, after_update=lambda state: after(inner_after(state)))

    return Algorithm(name=NAME, apply=apply, init=init)


def skipped_ranges(state: TrainState) -> list[tuple[int, int]]:
    """The `(first, last)` batch indices of each range the guard skipped, oldest first."""
    current = state.algo_state.get(NAME)
    if current is None:
        return []
    return [(int(a), int(b)) for a, b in current["skipped"].tolist() if b >= 0]


def skipped_batches(state: TrainState) -> list[int]:
    """The indices of the batches the guard rolled back and skipped, oldest first."""
    return [b for first, last in skipped_ranges(state) for b in range(first, last + 1)]


__all__ = ["LossSpikeError", "rollback_guard", "skipped_batches", "skipped_ranges"]
