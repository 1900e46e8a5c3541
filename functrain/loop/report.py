"""What `fit` says about a run: the status lines of its start and of an early stop.

Pure functions of the run's position, printed by the run's `ProgressBar` on rank 0 (so
`progress=False` silences them).

Example:
    >>> resumed("runs/a/step_000000120", None, state)
    'resumed from runs/a/step_000000120 at step 120 (epoch 2, batch 20)'
"""

from __future__ import annotations

from typing import Any

from ..units import Time

__all__ = ["already_finished", "length_changed", "resumed", "stopped", "where"]


def where(state: Any) -> str:
    """The run's position: "step N (epoch E, batch B)" (B counted in the epoch)."""
    ts = state.timestamp
    return f"step {state.step} (epoch {ts.epoch}, batch {ts.batch_in_epoch})"


def resumed(path: str | None, init_from: Any, state: Any) -> str:
    """The line after auto-resume: from a checkpoint (`path`), or from `init_from`'s weights."""
    if path is None:
        return f"starting from the weights of {init_from}"
    return f"resumed from {path} at {where(state)}"


def already_finished(state: Any, duration: Time) -> str:
    """The line of a run that had reached its duration before this call of `fit`."""
    return (
        f"run already finished at {where(state)} (duration {duration}); pass a longer duration "
        "to continue it"
    )


def length_changed(state: Any, previous: int, duration: Time) -> str | None:
    """The line of a continued run whose length in batches changed (None when it did not).

    Args:
        state: the state after the horizon was set for this call.
        previous: its `max_batches` before (0: unknown, or a fresh run).
        duration: this call's duration.
    """
    ts = state.timestamp
    if not ts.batch or not previous or ts.max_batches == previous:
        return None
    return (
        f"the run's length changed from {previous} to {ts.max_batches or '?'} batches (duration "
        f"{duration}): schedules in 'dur' or 'ep' units now follow the new length, as in "
        "Composer (the learning rate may jump); write their times in batches ('500ba') to keep "
        "them fixed"
    )


def stopped(boundary: Any, reason: str | None, state: Any, checkpoint: str | None) -> str:
    """The line of a run stopped before its end.

    Args:
        boundary: the agreed `preemption.Boundary` that stopped it.
        reason: `ctx.stop_reason`.
        state: the final state.
        checkpoint: the checkpoint written, or None when the run had no manager.
    """
    how = f"by {boundary.stop.name}" if boundary.preempted else f"({reason})"
    if checkpoint is None:
        saved = "no checkpoint was saved (fit had no checkpoints=)"
    else:
        saved = f"checkpoint {checkpoint}; run it again with autoresume to continue from there"
    return f"stopped {how} at {where(state)} before the end of the run; {saved}"
