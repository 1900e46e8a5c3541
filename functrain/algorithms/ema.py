"""Exponential moving average of the weights, as an `after_update` wrapper (Composer's `EMA`).

The average lives in `state.algo_state["ema"]` as an `EMAState`, so it checkpoints and resumes with
the rest of the state. It starts once `ema_start` has passed (initialised to the weights at that
moment) and is updated every `update_interval` (batches, or epoch ends), over all parameters and
floating-point buffers (BatchNorm statistics).

Training never uses the average; evaluation and export see it when asked:
`swap_in_ema(state)` returns the state with the EMA weights in place of the trained ones, and
`ema_params(state)` returns them alone.

Example:
    >>> step = functrain.compose(step, ema(half_life="1000ba"))
    >>> eval_state = swap_in_ema(state)   # evaluate or save the averaged model
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..functional.ema import compute_ema, smoothing_from_half_life
from ..state import TrainState
from ..step import Algorithm, StepPieces
from ..units import Time, TimeUnit
from .timing import at_epoch_end, check_units, epochs_completed, reached

NAME = "ema"
_DEFAULT_HALF_LIFE = object()  # lets ema(smoothing=0.9) work without also passing half_life=None


class EMAState(NamedTuple):
    """The moving average: `params` and `buffers` as `{fqn: tensor}`, and the updates so far.

    `num_updates == 0` means averaging has not started (the tensors are placeholders).
    """

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    num_updates: int


def init_ema(state: TrainState) -> EMAState:
    """An `EMAState` holding copies of the state's weights, not started."""
    return EMAState(
        params={k: v.detach().clone() for k, v in state.params.items()},
        buffers={k: v.detach().clone() for k, v in state.buffers.items()},
        num_updates=0,
    )


def ema(
    half_life: str | None = _DEFAULT_HALF_LIFE,  # type: ignore[assignment]
    smoothing: float | None = None,
    ema_start: str = "0.0dur",
    update_interval: str | None = None,
) -> Algorithm:
    """Keep an exponential moving average of the weights.

    Args:
        half_life: time for an old weight's share to halve, in "ba" or "ep" (default "1000ba").
            Give either this or `smoothing`.
        smoothing: the share of the old average kept per update, in [0, 1].
        ema_start: when averaging starts ("dur", "ba", "ep", "sp" or "tok"; default at once).
        update_interval: time between updates, in "ba" or "ep" (default: 1 in `half_life`'s unit,
            or "1ba" with `smoothing`).
    Returns:
        the `Algorithm` named "ema" (state in `algo_state["ema"]`, exactly resumable).
    Example:
        >>> algorithm = ema(half_life="100ba", update_interval="20ba")
    """
    if half_life is _DEFAULT_HALF_LIFE:
        half_life = None if smoothing is not None else "1000ba"
    if half_life is None and smoothing is None:
        raise ValueError("ema needs either half_life (e.g. '1000ba') or smoothing (e.g. 0.999)")
    if half_life is not None and smoothing is not None:
        raise ValueError("give ema either half_life or smoothing, not both")
    start = Time.coerce(ema_start)
    half = Time.coerce(half_life) if half_life is not None else None
    if update_interval is None:
        interval = Time(1, half.unit) if half is not None else Time(1, TimeUnit.BATCH)
    else:
        interval = Time.coerce(update_interval)
    units = (TimeUnit.BATCH, TimeUnit.EPOCH)
    check_units("ema update_interval", interval, units)
    if not isinstance(interval.value, int) or interval.value < 1:
        raise ValueError(f"ema update_interval must be a positive whole number, got {interval}")
    if half is not None:
        check_units("ema half_life", half, units)
        if half.unit is not interval.unit:
            raise ValueError(
                f"half_life ({half}) and update_interval ({interval}) need the same unit"
            )
        smoothing = smoothing_from_half_life(half.value, interval.value)
    elif not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"ema smoothing must be in [0, 1], got {smoothing}")

    def maybe_update(state: TrainState) -> TrainState:
        ts = state.timestamp
        if interval.unit is TimeUnit.EPOCH:
            if not at_epoch_end(ts) or epochs_completed(ts) % interval.value:
                return state
        elif ts.batch % interval.value:
            return state
        if not reached(ts, start):
            return state
        current = state.algo_state.get(NAME) or init_ema(state)
        if current.num_updates == 0:  # starting: the average begins at the current weights
            new = init_ema(state)._replace(num_updates=1)
        else:
            new = EMAState(
                params=compute_ema(state.params, current.params, smoothing),
                buffers=compute_ema(state.buffers, current.buffers, smoothing),
                num_updates=current.num_updates + 1,
            )
        return state.replace(algo_state={**state.algo_state, NAME: new})

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.after_update
        return pieces._replace(after_update=lambda state: maybe_update(inner(state)))

    return Algorithm(name=NAME, apply=apply, init=init_ema)


def ema_params(state: TrainState) -> dict[str, torch.Tensor]:
    """The EMA weights `{fqn: tensor}` (the trained ones until averaging has started).

    Raises:
        KeyError: when the state has no EMA (compose `ema()` into the step).
    """
    if NAME not in state.algo_state:
        raise KeyError(
            "the state has no EMA weights; compose functrain.algorithms.ema() into the step"
        )
    current = state.algo_state[NAME]
    return dict(state.params) if current.num_updates == 0 else dict(current.params)


def swap_in_ema(state: TrainState) -> TrainState:
    """`state` with the EMA weights and buffers in place of the trained ones (for eval/export).

    The result is for evaluation, checkpoint export or inference; keep training the original
    state. Before averaging has started it returns `state` unchanged.
    """
    if NAME not in state.algo_state:
        raise KeyError(
            "the state has no EMA weights; compose functrain.algorithms.ema() into the step"
        )
    current = state.algo_state[NAME]
    if current.num_updates == 0:
        return state
    return state.replace(
        params={**state.params, **current.params}, buffers={**state.buffers, **current.buffers}
    )


__all__ = ["EMAState", "ema", "ema_params", "init_ema", "swap_in_ema"]
