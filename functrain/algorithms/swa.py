"""Stochastic weight averaging as `after_update` and `update` wrappers (Composer's `SWA`).

From `swa_start` on, the weights are averaged (equal weights) every `update_interval`; the
running mean lives in `state.algo_state["swa"]` (`SWAState`). When `swa_end` is reached the
parameters are replaced by the average and training continues from there, so the remaining steps
re-estimate BatchNorm statistics for the averaged weights (keep `swa_end` below 1.0 for that, as
Composer advises). Buffers are not averaged.

With `schedule_swa_lr=True`, once averaging starts the learning rate follows SWA's own curve
instead of the optimizer's schedule: it anneals ("linear" or "cos") from the rate in effect at
`swa_start` to `swa_lr` (default: that same rate, i.e. held constant) over `anneal_steps`
averaging updates, and holds until `swa_end`. This works for any optimizer whose step is
proportional to its learning rate (SGD, Adam(W), Lion, decoupled weight decay): each update is
rescaled by `swa_lr / lr_used`. (The step's "lr" metric still reports the optimizer's own rate.)

After `swa_end` the state holds new parameter tensors; with a donating step the model module's
own parameters stop aliasing the state from then on (the state is what counts).

Example:
    >>> step = functrain.compose(step, swa(swa_start="0.7dur", swa_end="0.97dur"))
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..functional.swa import normalize_anneal_strategy, swa_average
from ..functional.swa import swa_lr as swa_lr_curve
from ..optim import current_lr
from ..state import TrainState
from ..step import Algorithm, StepPieces
from ..units import Time, TimeUnit
from .timing import at_epoch_end, check_units, elapsed

NAME = "swa"


class SWAState(NamedTuple):
    """SWA's progress.

    Attributes:
        params: the running mean `{fqn: tensor}` (placeholder copies until the first update).
        num_averaged: weight samples in the mean.
        events: update-interval events seen since averaging started.
        start_lr: the learning rate when averaging started.
        started: 1 once `swa_start` has passed.
        completed: 1 once the parameters were replaced by the average.
    """

    params: dict[str, torch.Tensor]
    num_averaged: int
    events: int
    start_lr: float
    started: int
    completed: int


def init_swa(state: TrainState) -> SWAState:
    """A not-yet-started `SWAState` for `state`'s parameters."""
    params = {k: v.detach().clone() for k, v in state.params.items()}
    return SWAState(params, num_averaged=0, events=0, start_lr=0.0, started=0, completed=0)


def swa(
    swa_start: str = "0.7dur",
    swa_end: str = "0.97dur",
    update_interval: str = "1ep",
    schedule_swa_lr: bool = False,
    anneal_strategy: str = "linear",
    anneal_steps: int = 10,
    swa_lr: float | None = None,
) -> Algorithm:
    """Average the weights late in training and finish from the average.

    Args:
        swa_start: when averaging starts ("dur" or "ep", same unit as `swa_end`).
        swa_end: when the parameters are replaced by the average.
        update_interval: time between averaging updates ("ba" or "ep").
        schedule_swa_lr: switch to SWA's learning-rate curve once averaging starts.
        anneal_strategy: "linear" or "cos".
        anneal_steps: averaging updates over which the learning rate anneals.
        swa_lr: the learning rate annealed to (None: keep the rate at `swa_start`).
    Returns:
        the `Algorithm` named "swa" (state in `algo_state["swa"]`, exactly resumable). Needs the
        run's horizon for "dur" times and `batches_per_epoch` for epoch times (`fit` sets both).
    """
    start, end = Time.coerce(swa_start), Time.coerce(swa_end)
    interval = Time.coerce(update_interval)
    check_units("swa_start", start, (TimeUnit.DURATION, TimeUnit.EPOCH))
    if start.unit is not end.unit:
        raise ValueError(f"swa_start and swa_end need the same unit, got {start} and {end}")
    if not start < end:
        raise ValueError(f"swa_end ({end}) must come after swa_start ({start})")
    if start.unit is TimeUnit.DURATION and end.value > 1:
        raise ValueError(f"duration times must be in [0, 1], got swa_end={end}")
    check_units("swa update_interval", interval, (TimeUnit.BATCH, TimeUnit.EPOCH))
    if not isinstance(interval.value, int) or interval.value < 1:
        raise ValueError(f"swa update_interval must be a positive whole number, got {interval}")
    if anneal_steps <= 0:
        raise ValueError(f"anneal_steps must be > 0, got {anneal_steps}")
    strategy = normalize_anneal_strategy(anneal_strategy)
    target_lr = swa_lr

    def maybe_average(state: TrainState) -> TrainState:
        current = state.algo_state.get(NAME) or init_swa(state)
        ts = state.timestamp
        if current.completed:
            return state
        if interval.unit is TimeUnit.EPOCH and not at_epoch_end(ts):
            return state
        if elapsed(ts, start.unit) < start.value:
            return state
        if not current.started:
            lr = current_lr(state.opt_state)
            current = current._replace(started=1, events=0, start_lr=float(lr or 0.0))
        if current.events % interval.value == 0:
            averaged = swa_average(current.params, state.params, current.num_averaged)
            current = current._replace(params=averaged, num_averaged=current.num_averaged + 1)
        current = current._replace(events=current.events + 1)
        if elapsed(ts, end.unit) >= end.value:
            current = current._replace(completed=1)
            params = {**state.params, **{k: v.clone() for k, v in current.params.items()}}
            state = state.replace(params=params)
        return state.replace(algo_state={**state.algo_state, NAME: current})

    def scaled_update(inner, grads, state: TrainState) -> TrainState:
        current = state.algo_state.get(NAME)
        if current is None or not current.started or current.completed:
            return inner(grads, state)
        goal = current.start_lr if target_lr is None else float(target_lr)
        wanted = swa_lr_curve(current.start_lr, goal, current.num_averaged, anneal_steps, strategy)
        saved = {k: state.params[k].clone() for k in grads}  # a donating update writes in place
        new = inner(grads, state)
        used = current_lr(new.opt_state)
        if used is None:
            raise ValueError(
                "swa(schedule_swa_lr=True) needs an optimizer whose state records its learning "
                "rate (every functrain.optim optimizer does)"
            )
        if used == 0 or wanted == used:
            return new
        ratio = wanted / used
        params = dict(new.params)
        for k in grads:
            step = saved[k] + (params[k] - saved[k]) * ratio
            if params[k] is state.params[k]:
                params[k].copy_(step)
            else:
                params[k] = step
        return new.replace(params=params)

    def apply(pieces: StepPieces) -> StepPieces:
        inner_after, inner_update = pieces.after_update, pieces.update
        changes = {"after_update": lambda state: maybe_average(inner_after(state))}
        if schedule_swa_lr:
            changes["update"] = lambda grads, state: scaled_update(inner_update, grads, state)
        return pieces._replace(**changes)

    return Algorithm(name=NAME, apply=apply, init=init_swa)


def swa_params(state: TrainState) -> dict[str, torch.Tensor]:
    """The SWA average `{fqn: tensor}` so far (the trained weights before the first update)."""
    if NAME not in state.algo_state:
        raise KeyError(
            "the state has no SWA average; compose functrain.algorithms.swa() into the step"
        )
    current = state.algo_state[NAME]
    return dict(state.params) if current.num_averaged == 0 else dict(current.params)
