"""Selective backprop (Jiang et al., 2019): backpropagate only through the harder examples.

Composer's semantics: a forward pass without gradients (optionally on downsampled inputs) scores
every example by its loss; examples are ranked by loss and `int(keep * N)` of them are drawn
without replacement, the one at percentile `p` (of rank) with probability proportional to
`p ** (1 / keep - 1)`, so hard examples are likely kept and easy ones still sometimes. It runs only
between `start` and `end` (fractions of training), and every `interrupt`-th batch is a normal one.

Example:
    >>> should_selective_backprop(0.6, batch_idx=0, start=0.5, end=0.9, interrupt=2)
    True
    >>> should_selective_backprop(0.6, batch_idx=1, start=0.5, end=0.9, interrupt=2)
    False
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .sampling import require_generator

_INTERPOLATE_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def should_selective_backprop(
    current_duration: float,
    batch_idx: int,
    start: float = 0.5,
    end: float = 0.9,
    interrupt: int = 2,
) -> bool:
    """Whether this batch is pruned: inside `[start, end)` and not an `interrupt`-th batch.

    Args:
        current_duration: the fraction of training done.
        batch_idx: the batch's index within its epoch.
        start, end: the interval (fractions of training) where pruning happens.
        interrupt: every `interrupt`-th batch is a normal one (0: never interrupt).
    """
    in_interval = start <= current_duration < end
    is_pruned_step = interrupt == 0 or (batch_idx + 1) % interrupt != 0
    return in_interval and is_pruned_step


def selection_probabilities(n: int, keep: float) -> torch.Tensor:
    """The probability of drawing the example of each loss rank (ascending), float64."""
    percentiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    weights = percentiles ** ((1.0 / keep) - 1.0)
    return weights / weights.sum()


def select_indices_using_loss(
    losses: torch.Tensor, keep: float = 0.5, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Indices of the `int(keep * N)` examples drawn by loss rank (in draw order).

    Args:
        losses: `(N,)` per-example losses.
        keep: the fraction kept, in (0, 1].
        generator: the source of the draw.
    Returns:
        `(int(keep * N),)` indices into the batch.
    """
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    if losses.dim() != 1:
        raise ValueError(
            f"expected one loss per example (shape (N,)), got shape {tuple(losses.shape)}; "
            "the loss function must honour reduction='none'"
        )
    n = losses.shape[0]
    n_select = int(keep * n)
    if n_select == 0:
        raise ValueError(f"keep={keep} of a batch of {n} keeps no example; raise keep")
    ranked = torch.argsort(losses.detach().float().cpu())
    gen = require_generator(generator, "selective backprop's example draw")
    picks = torch.multinomial(
        selection_probabilities(n, keep), n_select, replacement=False, generator=gen
    )
    return ranked[picks]


def per_example_losses(
    input: torch.Tensor,
    target: Any,
    model: Callable[[torch.Tensor], torch.Tensor],
    loss_fun: Callable[..., torch.Tensor],
    scale_factor: float = 1.0,
) -> torch.Tensor:
    """Per-example losses from a forward pass without gradients (on downsampled inputs if asked)."""
    if not 0 < scale_factor <= 1:  # written so that NaN is refused too
        raise ValueError(f"scale_factor must be in (0, 1], got {scale_factor}")
    if not callable(loss_fun):
        raise TypeError("loss_fun must be callable as loss_fun(outputs, targets, reduction='none')")
    params = inspect.signature(loss_fun).parameters
    if "reduction" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise TypeError(
            "loss_fun must take a `reduction` keyword so that reduction='none' returns one loss "
            "per example (e.g. torch.nn.functional.cross_entropy)"
        )
    with torch.no_grad():
        x = input
        if scale_factor < 1:
            if input.dim() not in _INTERPOLATE_MODES:
                raise ValueError(
                    f"scale_factor != 1 needs 3-D, 4-D or 5-D inputs, got {input.dim()}-D"
                )
            x = F.interpolate(
                input,
                scale_factor=scale_factor,
                mode=_INTERPOLATE_MODES[input.dim()],
                align_corners=False,
                recompute_scale_factor=False,
            )
        losses = loss_fun(model(x), target, reduction="none")
    if losses.dim() > 1:  # e.g. per-token losses: one score per example
        losses = losses.flatten(1).mean(1)
    return losses


def select_using_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    model: Callable[[torch.Tensor], torch.Tensor],
    loss_fun: Callable[..., torch.Tensor],
    keep: float = 0.5,
    scale_factor: float = 1.0,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples selective backprop keeps from a batch.

    Args:
        input: `(N, ...)` inputs.
        target: `(N, ...)` targets.
        model: `inputs -> outputs` (called once, without gradients).
        loss_fun: `loss_fun(outputs, targets, reduction='none')`, one loss per example.
        keep: the fraction of the batch kept, in (0, 1]. Default 0.5.
        scale_factor: downsample the inputs of the scoring pass by this factor (<= 1).
        generator: the source of the draw.
    Returns:
        `(input[selected], target[selected])`.
    """
    losses = per_example_losses(input, target, model, loss_fun, scale_factor)
    selected = select_indices_using_loss(losses, keep, generator=generator).to(input.device)
    return input[selected], target[selected.to(target.device)]
