"""Rollback on a loss spike: undo the step of a batch that derails training, and skip the batch.

What the PaLM and OPT logbooks did by hand at 3 a.m. (roll back, skip the batches, go on), as
the step's `guard` piece: when the loss -- already the mean over data-parallel ranks, so every
rank decides alike -- exceeds `factor` times the mean of the last `window` accepted losses (after
`warmup` of them), or is not finite, the update is not applied: the run goes on from the state
before that batch (the in-memory snapshot the step still holds), and the batch counts as
consumed. The skipped batch indices live in `state.algo_state["rollback"]`, so they checkpoint
with the state: a resumed run knows what was skipped, and one that replays the spike from an
earlier checkpoint takes the same decision (the history it decides on is in the state too).

Each rollback is logged (`functrain.rollback` logger: the step, the loss, the skipped batch) and
shows as `metrics["skipped"]`. `max_in_a_row` rollbacks in a row stop the run with an error: a
loss that stays high is not a spike, and a person should look.

Only the one step is rolled back: params, buffers and the optimizer state (its counters
included) stay those before the batch, so the run continues exactly as one whose data never
held it; `state.step` and the timestamp still advance (the batch was consumed).

Example:
    >>> step = functrain.compose(functrain.make_step(model, loss_fn, opt), rollback_guard(5.0))
    >>> skipped_batches(state)
    [39]
"""

from __future__ import annotations

import logging
import math

import torch

from ..state import TrainState
from ..step.pieces import Algorithm, StepPieces

NAME = "rollback"
logger = logging.getLogger("functrain.rollback")


class LossSpikeError(RuntimeError):
    """The loss spiked `max_in_a_row` steps in a row: not a spike, a derailed run."""


def rollback_guard(
    factor: float = 5.0,
    *,
    window: int = 20,
    warmup: int = 10,
    max_in_a_row: int = 3,
    capacity: int = 64,
) -> Algorithm:
    """Roll back and skip any batch whose loss spikes above `factor` x its recent mean.

    Args:
        factor: a loss above `factor` times the mean of the recent accepted losses is a spike.
        window: how many of the newest accepted losses make the recent mean.
        warmup: accepted losses needed before finite spikes are judged (non-finite ones always
            are).
        max_in_a_row: this many rollbacks in a row raise `LossSpikeError`.
        capacity: how many skipped batch indices the state records (the oldest are dropped).
    Returns:
        the `Algorithm` named "rollback" (state in `algo_state["rollback"]`, exactly resumable).
    Example:
        >>> step = functrain.compose(make_step(model, loss_fn, opt), rollback_guard(4.0))
    """
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 1):
        raise ValueError(f"rollback_guard(factor=...) must be a finite number > 1, got {factor!r}")
    for name, value in (
        ("window", window),
        ("warmup", warmup),
        ("max_in_a_row", max_in_a_row),
        ("capacity", capacity),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"rollback_guard({name}=...) must be a positive int, got {value!r}")

    def init(state: TrainState) -> dict:
        return {
            "history": torch.zeros(window, dtype=torch.float64),
            "accepted": torch.tensor(0, dtype=torch.int64),
            "streak": torch.tensor(0, dtype=torch.int64),
            "skipped": torch.full((capacity,), -1, dtype=torch.int64),
        }

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
            return state.replace(algo_state={**state.algo_state, NAME: new}), False
        streak = int(current["streak"]) + 1
        batch = state.timestamp.batch  # the index of the batch being rolled back
        mean = "(none yet)" if baseline is None else f"{baseline:.6g}"
        if streak >= max_in_a_row:
            raise LossSpikeError(
                f"the loss spiked {streak} steps in a row (now {loss:.6g} at batch {batch}, "
                f"recent mean {mean}): the run is derailed, not hit by one bad batch. "
                "Resume from an earlier checkpoint with a lower learning rate, or raise "
                "rollback_guard(max_in_a_row=...)"
            )
        skipped = torch.cat([current["skipped"][1:], torch.tensor([batch])])
        logger.warning(
            "functrain.rollback: loss %.6g at step %d (batch %d) exceeds %g x its recent mean "
            "%s; rolled back to the state before it and skipped batches [%d, %d]",
            loss, state.step + 1, batch, factor, mean, batch, batch,
        )  # fmt: skip
        new = {**current, "streak": torch.tensor(streak), "skipped": skipped}
        return state.replace(algo_state={**state.algo_state, NAME: new}), True

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.guard

        def guard(result, grad_norm, state):
            state, skip = inner(result, grad_norm, state)
            # One host sync per step, as skip_nonfinite: the update must not run at all.
            loss = float(result.loss.detach().float())
            finite = math.isfinite(loss) and bool(torch.isfinite(grad_norm))
            state, spike = decide(loss, finite, state)
            return state, skip or spike

        return pieces._replace(guard=guard)

    return Algorithm(name=NAME, apply=apply, init=init)


def skipped_batches(state: TrainState) -> list[int]:
    """The indices of the batches the guard rolled back and skipped, oldest first."""
    current = state.algo_state.get(NAME)
    if current is None:
        return []
    return [int(b) for b in current["skipped"].tolist() if b >= 0]


__all__ = ["LossSpikeError", "rollback_guard", "skipped_batches"]
