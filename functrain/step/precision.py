"""Mixed precision for the step: autocast contexts and dynamic loss scaling held in state.

`fp32` runs as is; `amp_bf16` runs the forward pass under `torch.autocast(bfloat16)`; `amp_fp16`
does the same in float16 and scales the loss so small gradients survive, with the scale kept in
`state.algo_state["loss_scale"]` (so it checkpoints and resumes like everything else).

Loss scaling is an `Algorithm` (`loss_scaling()`) that `make_step(precision="amp_fp16")` composes
first: its `grads` wrapper scales the loss going in and unscales the gradients coming out, and its
`guard` halves the scale and skips the update on a step whose gradients overflowed. Both are
decided on the device (`torch.where` for the scale, a 0-d bool tensor for the skip, see
`functrain.step.guards`): unlike `torch.amp.GradScaler` with a non-fused optimizer, nothing is read
back to the host.

Example:
    >>> with autocast_context("amp_bf16", "cpu"):
    ...     y = torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 3))
    >>> y.dtype
    torch.bfloat16
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from .. import _torch
from .guards import all_finite, either
from .pieces import Algorithm, StepPieces

PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
LOSS_SCALE_KEY = "loss_scale"


class LossScaleState(NamedTuple):
    """Dynamic loss scale: the current scale and how many finite steps in a row it has seen."""

    scale: torch.Tensor  # 0-d float32
    good_steps: torch.Tensor  # 0-d int64


def check_precision(precision: str) -> str:
    """Validate a precision name, naming the accepted ones on error."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {PRECISIONS}")
    return precision


def autocast_context(precision: str, device_type: str):
    """The context the forward pass runs in for `precision` on `device_type`."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "amp_bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


def init_loss_scale(
    init_scale: float = 2.0**16, device: str | torch.device = "cpu"
) -> LossScaleState:
    """The initial loss scale (PyTorch's GradScaler starts at 2**16 too)."""
    return LossScaleState(
        scale=torch.tensor(init_scale, dtype=torch.float32, device=device),
        good_steps=torch.zeros((), dtype=torch.int64, device=device),
    )


def update_loss_scale(
    state: LossScaleState,
    grads_finite: torch.Tensor,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> LossScaleState:
    """Halve the scale after a non-finite step; double it after `growth_interval` finite steps.

    Args:
        state: the current `LossScaleState`.
        grads_finite: 0-d bool tensor, True when every gradient was finite.
    Returns:
        the next `LossScaleState`.
    """
    good = torch.where(grads_finite, state.good_steps + 1, torch.zeros_like(state.good_steps))
    grow = good >= growth_interval
    scale = torch.where(
        grads_finite,
        torch.where(grow, state.scale * growth_factor, state.scale),
        state.scale * backoff_factor,
    )
    good = torch.where(grow, torch.zeros_like(good), good)
    return LossScaleState(scale=scale, good_steps=good)


def loss_scaling(
    init_scale: float = 2.0**16,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> Algorithm:
    """Dynamic fp16 loss scaling as pieces (what `make_step(precision="amp_fp16")` composes).

    The `grads` wrapper multiplies each microbatch's loss by the scale before differentiating and
    divides the gradients and the reported loss by it after (the scale is a power of two, so
    both are exact); the `guard` wrapper updates the scale (`update_loss_scale`) and skips the
    update when the gradients or the loss are not finite.

    Args:
        init_scale: the first scale.
        growth_factor, backoff_factor, growth_interval: see `update_loss_scale`.
    Returns:
        the `Algorithm` named "loss_scale", its state a `LossScaleState` in
        `state.algo_state["loss_scale"]`.
    """

    def init(state) -> LossScaleState:
        device = next(iter(state.params.values())).device if state.params else "cpu"
        return init_loss_scale(init_scale, device=device)

    def apply(pieces: StepPieces) -> StepPieces:
        inner_grads, inner_guard = pieces.grads, pieces.guard

        def grads(all_pieces, state, batch):
            scale = state.algo_state[LOSS_SCALE_KEY].scale
            loss = all_pieces.loss

            def scaled_loss(model, batch):
                value, aux = loss(model, batch)
                # In float32: the scaled loss of a float16 forward would overflow in float16.
                return value.float() * scale, aux

            result = inner_grads(all_pieces._replace(loss=scaled_loss), state, batch)
            return result._replace(
                grads=dict(
                    zip(result.grads, _torch.foreach_div(list(result.grads.values()), scale))
                ),
                loss=result.loss / scale,
            )

        def guard(result, grad_norm, state):
            state, skip = inner_guard(result, grad_norm, state)
            finite = all_finite(result, grad_norm)
            current = state.algo_state[LOSS_SCALE_KEY]
            scale = update_loss_scale(
                current,
                finite,
                growth_factor=growth_factor,
                backoff_factor=backoff_factor,
                growth_interval=growth_interval,
            )
            state = state.replace(algo_state={**state.algo_state, LOSS_SCALE_KEY: scale})
            # Decided on the device: an overflowed update is discarded, never read on the host.
            return state, either(skip, ~finite)

        return pieces._replace(grads=grads, guard=guard)

    return Algorithm(name=LOSS_SCALE_KEY, apply=apply, init=init)
