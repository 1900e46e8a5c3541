"""The step's record types: `StepPieces`, `GradResult`, `Algorithm`, `StepConfig`.

These are the nouns `functrain.step` is built from and that speedup algorithms rewrite. They live
apart from the step's machinery so that modules the step itself builds on (precision, guards) can
use them without importing the step; `functrain.step` re-exports them, and that is where
algorithms import them from (`from functrain.step import Algorithm, StepPieces`).

Example:
    >>> def no_op(pieces: StepPieces) -> StepPieces:
    ...     return pieces
    >>> Algorithm(name="no_op", apply=no_op)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..state import TrainState

Batch = Any


class GradResult(NamedTuple):
    """What the `grads` piece returns."""

    grads: dict[str, torch.Tensor]  # over trainable params, averaged over the batch
    loss: torch.Tensor  # 0-d, mean over the batch (unscaled)
    aux: dict[str, Any]  # from loss_fn
    buffers: dict[str, torch.Tensor]  # buffers after the forward pass(es)


def no_guard(result: GradResult, grad_norm: torch.Tensor, state: TrainState):
    """The default `guard` piece: never skip, change nothing (and never sync with the device)."""
    del result, grad_norm
    return state, False


class StepPieces(NamedTuple):
    """The named pieces a step is made of, in the order the step runs them.

    Attributes:
        prepare: `(state, batch) -> batch`, the data side (MixUp, resizing, ...).
        loss: `(model, batch) -> (loss, aux)`, the user's loss function, normalised.
        grads: `(pieces, state, batch) -> GradResult`, forward, loss and gradients
            (microbatched); calls `pieces.loss`.
        transform_grads: `(grads, state) -> grads`, clipping, SAM's correction, ...
        update: `(grads, state) -> state`, the optimizer and `apply_updates`. Not called on a
            step the guard skips by a Python bool; run and undone on the device on one it skips
            by a tensor (`functrain.step.guards`).
        after_update: `state -> state`, EMA, SWA, ... (runs on skipped steps too: time passed).
        call_model: `(state, *args, **kwargs) -> outputs`, the model with the state's tensors,
            without gradients (evaluation, scoring).
        guard: `(result, grad_norm, state) -> (state, skip)`, decides whether the update runs
            (`result.loss` is the mean over data-parallel ranks, as `grad_norm` is global, so
            every rank decides alike).
            `skip` is a Python bool, or a 0-d bool tensor that stays on the device (the built-in
            guards: no host sync; a guard that reads device values into a bool syncs once per
            step; the default guard never does). The state it returns carries the guard's own
            bookkeeping (the fp16 loss scale). On a skipped step params, buffers and the
            optimizer state are left exactly as they were; `state.step` and the timestamp still
            advance (the batch was consumed).
        installers: what algorithms install on the model for each forward pass
            (`forward_run.Installer`: activation offload, activation checkpointing), applied by
            the `grads` piece's `ForwardRun` in its declared order, around `loss`.
    """

    prepare: Callable[[TrainState, Batch], Batch]
    loss: Callable[[Callable, Batch], tuple[torch.Tensor, dict]]
    grads: Callable[[StepPieces, TrainState, Batch], GradResult]
    transform_grads: Callable[[dict, TrainState], dict]
    update: Callable[[dict, TrainState], TrainState]
    after_update: Callable[[TrainState], TrainState]
    call_model: Callable[..., Any]
    guard: Callable[
        [GradResult, torch.Tensor, TrainState], tuple[TrainState, bool | torch.Tensor]
    ] = no_guard
    installers: tuple = ()


class Algorithm(NamedTuple):
    """A speedup method as a transform of the step's pieces.

    Attributes:
        name: its key in `state.algo_state`.
        apply: `StepPieces -> StepPieces`.
        init: `TrainState -> pytree`, the initial `state.algo_state[name]` (None: no state).
        resumable: False when a resumed run cannot match the uninterrupted one exactly.
        surgery: `Module -> Module` on a copy, applied once before `init` by
            `functrain.algorithms.apply_surgery` (None: no model surgery).
    """

    name: str
    apply: Callable[[StepPieces], StepPieces]
    init: Callable[[TrainState], Any] | None = None
    resumable: bool = True
    surgery: Callable[[torch.nn.Module], torch.nn.Module] | None = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The options of `make_step` (see its docstring)."""

    precision: str = "fp32"
    microbatch_size: int | str | None = None
    weight_by: str = "samples"
    count_tokens: Callable[[Batch], int] | None = None
    skip_nonfinite: bool = False
    donate: bool = False
    grad_mode: str = "autograd"
    report_grad_norms: bool = False


def normalize_loss(out: Any) -> tuple[torch.Tensor, dict]:
    """`loss` or `(loss, aux)` from a loss function as `(loss, aux_dict)`."""
    if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
        loss, aux = out, {}
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        loss, aux = out
        aux = dict(aux) if isinstance(aux, dict) else {"aux": aux}
    else:
        raise TypeError(
            "loss_fn(model, batch) must return a scalar tensor or (loss, aux_dict); "
            f"got {type(out).__name__}"
        )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            "loss_fn must return a scalar loss tensor (reduce it, e.g. with .mean()); got "
            f"{'shape ' + str(tuple(loss.shape)) if isinstance(loss, torch.Tensor) else type(loss)}"
        )
    # A 0-d loss (the usual `.mean()`) is returned as it is: no reshape op per step.
    return (loss if loss.dim() == 0 else loss.reshape(())), aux
