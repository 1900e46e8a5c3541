"""Stochastic weight averaging: the running mean of weights and the SWA learning-rate curve.

`swa_average(average, params, num_averaged)` folds one more sample into an equal-weight running
mean (PyTorch's `AveragedModel` rule). `swa_lr(...)` is the learning rate SWA uses once
averaging has started: it anneals from the rate in effect at the start to `swa_lr` over
`anneal_steps` averaging updates, linearly or along a cosine, and then holds.

Example:
    >>> avg = swa_average({"w": torch.zeros(1)}, {"w": torch.ones(1)}, num_averaged=1)
    >>> avg["w"]
    tensor([0.5000])
"""

from __future__ import annotations

import math

import torch

ANNEAL_STRATEGIES = ("linear", "cos")


def swa_average(
    average: dict[str, torch.Tensor], params: dict[str, torch.Tensor], num_averaged: int
) -> dict[str, torch.Tensor]:
    """The running mean after adding `params` to an average of `num_averaged` samples.

    Args:
        average: `{name: tensor}`, the mean so far (ignored when `num_averaged` is 0).
        params: `{name: tensor}`, the new sample.
        num_averaged: how many samples `average` holds.
    Returns:
        new tensors `average + (params - average) / (num_averaged + 1)`.
    """
    if num_averaged < 0:
        raise ValueError(f"num_averaged must be >= 0, got {num_averaged}")
    if num_averaged == 0:
        return {k: v.detach().clone() for k, v in params.items()}
    out = {}
    for k, p in params.items():
        a = average[k]
        if not a.is_floating_point():
            out[k] = p.detach().clone()
            continue
        out[k] = a + (p.detach().to(a.dtype) - a) / (num_averaged + 1)
    return out


def normalize_anneal_strategy(strategy: str) -> str:
    """ "linear"/"lin" -> "linear", "cos"/"cosine" -> "cos"; anything else is an error."""
    key = strategy.lower()
    if key in ("linear", "lin"):
        return "linear"
    if key in ("cos", "cosine"):
        return "cos"
    raise ValueError(f"anneal_strategy must be 'linear' or 'cos', got {strategy!r}")


def swa_lr(
    start_lr: float,
    target_lr: float,
    updates_done: int,
    anneal_steps: int,
    strategy: str = "linear",
) -> float:
    """The SWA learning rate after `updates_done` averaging updates.

    Args:
        start_lr: the learning rate when averaging started.
        target_lr: the rate to anneal to.
        updates_done: averaging updates so far (the anneal advances one step per update).
        anneal_steps: updates over which to anneal.
        strategy: "linear" or "cos".
    Returns:
        `start_lr + (target_lr - start_lr) * f(min(1, updates_done / anneal_steps))`.
    """
    if anneal_steps <= 0:
        raise ValueError(f"anneal_steps must be > 0, got {anneal_steps}")
    t = min(1.0, max(0, updates_done) / anneal_steps)
    if normalize_anneal_strategy(strategy) == "cos":
        t = (1.0 - math.cos(math.pi * t)) / 2.0
    return start_lr + (target_lr - start_lr) * t
