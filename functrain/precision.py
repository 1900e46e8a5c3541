"""Mixed precision for the step: autocast contexts and dynamic loss scaling held in state.

`fp32` runs as is; `amp_bf16` runs the forward pass under `torch.autocast(bfloat16)`; `amp_fp16`
does the same in float16 and scales the loss so small gradients survive, with the scale kept in
`state.algo_state["loss_scale"]` (so it checkpoints and resumes like everything else).

The scale update is written with `torch.where`, so it never forces a host sync.

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
