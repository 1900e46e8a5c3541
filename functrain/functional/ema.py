"""Exponential moving average of weights: the pure update and the half-life arithmetic.

`compute_ema(model_params, ema_params, smoothing)` returns
`smoothing * ema + (1 - smoothing) * model` for every floating-point tensor (integer tensors, such
as BatchNorm's batch counter, are copied from the model). Smoothing 0 gives the model's tensors
exactly; smoothing 1 keeps the average.

A half-life of `h` updates corresponds to `smoothing = 2 ** (-1 / h)`: after `h` updates an old
weight's share has halved.

Example:
    >>> ema = compute_ema({"w": torch.ones(2)}, {"w": torch.zeros(2)}, smoothing=0.75)
    >>> ema["w"]
    tensor([0.2500, 0.2500])
"""

from __future__ import annotations

import torch

from .. import _torch


def compute_ema(
    model_params: dict[str, torch.Tensor],
    ema_params: dict[str, torch.Tensor],
    smoothing: float,
) -> dict[str, torch.Tensor]:
    """The next moving average (new tensors; the inputs are not modified).

    Args:
        model_params: `{name: tensor}` of the current weights.
        ema_params: `{name: tensor}` of the average so far, with the same names.
        smoothing: the share of the old average kept, in [0, 1].
    Returns:
        `{name: smoothing * ema + (1 - smoothing) * model}`.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"EMA smoothing must be in [0, 1], got {smoothing}")
    if set(model_params) != set(ema_params):
        missing = sorted(set(model_params) ^ set(ema_params))[:5]
        raise KeyError(
            f"model and EMA tensors differ in names (e.g. {missing}); re-initialise the EMA"
        )
    names = [k for k in model_params if ema_params[k].is_floating_point()]
    out = {k: model_params[k].detach().clone() for k in model_params if k not in set(names)}
    if names:
        # lerp(ema, model, 1 - s) = s * ema + (1 - s) * model, and exactly `model` at s = 0
        ema = [ema_params[k] for k in names]
        model = [model_params[k].detach().to(ema_params[k].dtype) for k in names]
        if _torch.functorch_transforms_active():  # vmap: no batching rule for foreach kernels
            mixed = [torch.lerp(e, m, 1.0 - smoothing) for e, m in zip(ema, model)]
        else:
            mixed = _torch.foreach_lerp(ema, model, 1.0 - smoothing)
        out.update(zip(names, mixed))
    return {k: out[k] for k in model_params}


def smoothing_from_half_life(half_life: float, update_interval: float = 1.0) -> float:
    """The per-update smoothing for a half-life (both in the same time unit).

    Args:
        half_life: time for an old weight's share to halve (0: no averaging).
        update_interval: time between updates.
    Returns:
        `2 ** (-update_interval / half_life)`.
    """
    if half_life < 0 or update_interval <= 0:
        raise ValueError(
            f"half_life must be >= 0 and update_interval > 0, got {half_life}, {update_interval}"
        )
    if half_life == 0:
        return 0.0
    return 2.0 ** (-update_interval / half_life)
