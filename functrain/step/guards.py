"""Guards: pieces that decide whether a step's update runs (`make_step(skip_nonfinite=True)`).

A guard is the step's `guard` piece, `(result, grad_norm, state) -> (state, skip)`. A step it
skips leaves params, buffers and the optimizer state (its counters included) exactly as they
were; only `state.step` and the timestamp advance (the batch was consumed). The fp16 loss
scale's guard lives in `functrain.step.precision`.

`skip` is a Python bool (the update is then not called at all) or a 0-d bool tensor: the
decision stays on the device. The built-in guards return a tensor, so a guarded step reads
nothing back to the host: on a GPU the queue never drains, and on several ranks no rank waits
for the mean loss of the others. The update then runs and is kept or discarded elementwise
(`keep_update`): torch's fused Adam and SGD kernels take the decision as their `found_inf` and
write nothing; other updates run on and are undone from a copy taken before. Either way a kept
update is bit-identical to an unguarded one. A step without a guard does none of this.

Example:
    >>> step = functrain.make_step(model, loss_fn, opt, skip_nonfinite=True)
    >>> state, metrics = step(state, batch_with_an_inf)
    >>> bool(metrics["skipped"])
    True
"""

from __future__ import annotations

from typing import Any

import torch

from ..optim import keeping
from ..optim.keeping import keep_where, snapshot
from ..state import TrainState
from ..tree import tree_leaves
from .pieces import Algorithm, GradResult, StepPieces

SKIP_NONFINITE = "skip_nonfinite"
Skip = bool | torch.Tensor


def all_finite(result: GradResult, grad_norm: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor: the loss and the gradient norm are finite (no host sync).

    The norm of the gradients is finite exactly when every gradient element is (an overflowing
    sum of squares also counts as not finite, which is what a step should skip anyway).
    """
    return torch.isfinite(grad_norm) & torch.isfinite(result.loss)


def either(skip: Skip, other: Skip) -> Skip:
    """`skip or other` without reading a tensor on the host: a bool when both are bools.

    Example:
        >>> either(False, torch.tensor(True))
        tensor(True)
    """
    if skip is True or other is True:
        return True
    if skip is False:
        return other
    if other is False:
        return skip
    return torch.logical_or(skip, other)


def run_update(
    update: Any,
    default: Any,
    grads: dict,
    state: TrainState,
    norm: torch.Tensor | None,
    skip: torch.Tensor | None,
    donate: bool,
    transformed: bool = False,
) -> TrainState:
    """The step's `update` piece, under a guard's device decision `skip` (None: there is none).

    Args:
        update: the `update` piece.
        default: the step's own piece (`UpdatePiece`): it takes the gradients' global `norm`
            and the decision in hand (the fused kernels' `found_inf`).
        grads, state: what the piece is given (`state` is consumed when `donate`).
        norm, skip, donate: as above.
        transformed: the step runs under torch.func transforms (asked once per step call).
    Returns:
        the updated state, or where `skip` holds, one with `state`'s values.
    """
    if update is default:
        return default(grads, state, norm, skip=skip, transformed=transformed)
    return keep_update(skip, update, grads, state, donate)


def keep_update(
    skip: torch.Tensor | None, update: Any, grads: dict, state: TrainState, donate: bool
) -> TrainState:
    """A custom `update(grads, state)` piece run under a device decision: on a skip its params
    and optimizer state are put back from a copy taken before (where it updates in place).

    Args:
        skip: 0-d bool tensor (None: no decision, the piece just runs).
        update: the `update` piece.
        grads: the gradients it is given.
        state: the state it is given (consumed when `donate`).
        donate: the step donates (the piece may overwrite `state`'s tensors).
    Returns:
        the updated state, or, where `skip` holds, one with `state`'s values.
    """
    if skip is None:
        return update(grads, state)
    before = (state.params, state.opt_state)
    saved = snapshot(before) if donate else None
    new = update(grads, state)
    params, opt_state = keep_where(skip, before, (new.params, new.opt_state), saved)
    return new.replace(params=params, opt_state=opt_state)


def keep_buffers(
    skip: torch.Tensor | None, before: dict, after: dict, saved: list[torch.Tensor] | None
) -> dict:
    """The buffers after the forward pass (`after`), or where `skip` holds, `before`'s values
    (`saved`: their copies, when the forward pass wrote into `before`'s tensors in place)."""
    if skip is None or (after is before and saved is None):
        return after
    kept: list[torch.Tensor | None] | None = None
    if saved is not None:  # in the order of `before`'s leaves, which may not be the dict's
        kept = list(tree_leaves(dict(zip(before, saved))))
    return keep_where(skip, before, after, kept)


def counts_on_device(state: TrainState) -> TrainState:
    """`state` with its optimizer's update counts as 0-d tensors on the params' device, which a
    device decision can keep or advance (`functrain.optim.keeping.counts_on_device`); the same
    object when they are already."""
    device = next(iter(state.params.values())).device if state.params else "cpu"
    opt_state = keeping.counts_on_device(state.opt_state, device)
    return state if opt_state is state.opt_state else state.replace(opt_state=opt_state)


def skip_nonfinite() -> Algorithm:
    """Skip the update of any step whose loss or gradient norm is not finite.

    Returns:
        the `Algorithm` named "skip_nonfinite" (stateless): it wraps the `guard` piece and
        decides on the device (a 0-d bool tensor, never read on the host).
        `metrics["skipped"]` holds it.
    """

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.guard

        def guard(result, grad_norm, state):
            state, skip = inner(result, grad_norm, state)
            return state, either(skip, ~all_finite(result, grad_norm))

        return pieces._replace(guard=guard)

    return Algorithm(name=SKIP_NONFINITE, apply=apply)
