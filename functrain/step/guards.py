"""Guards: pieces that decide whether a step's update runs (`make_step(skip_nonfinite=True)`).

A guard is the step's `guard` piece, `(result, grad_norm, state) -> (state, skip)`. When it says
skip, the step does not call the `update` piece at all, so nothing is written, donated or not:
params, buffers and the optimizer state (its counters included) stay exactly as they were, and
only `state.step` and the timestamp advance (the batch was consumed). The fp16 loss scale's guard
lives in `functrain.step.precision`.

Deciding needs the device's answer on the host, so a guard costs one synchronisation per step, as
`torch.amp.GradScaler` does; a step without a guard never synchronises.

Example:
    >>> step = functrain.make_step(model, loss_fn, opt, skip_nonfinite=True)
    >>> state, metrics = step(state, batch_with_an_inf)
    >>> metrics["skipped"]
    True
"""

from __future__ import annotations

import torch

from .pieces import Algorithm, GradResult, StepPieces

SKIP_NONFINITE = "skip_nonfinite"


def all_finite(result: GradResult, grad_norm: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor: the loss and the gradient norm are finite (no host sync).

    The norm of the gradients is finite exactly when every gradient element is (an overflowing
    sum of squares also counts as not finite, which is what a step should skip anyway).
    """
    return torch.isfinite(grad_norm) & torch.isfinite(result.loss)


def skip_nonfinite() -> Algorithm:
    """Skip the update of any step whose loss or gradient norm is not finite.

    Returns:
        the `Algorithm` named "skip_nonfinite" (stateless): it wraps the `guard` piece, syncing
        once per step to decide. `metrics["skipped"]` says whether the step was skipped.
    """

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.guard

        def guard(result, grad_norm, state):
            state, skip = inner(result, grad_norm, state)
            # One host sync per step: the update must not run (and write in place) at all.
            return state, skip or not bool(all_finite(result, grad_norm))

        return pieces._replace(guard=guard)

    return Algorithm(name=SKIP_NONFINITE, apply=apply)
