"""Gradient clipping as pure functions on `{name: grad}` dicts: by global norm, by value, adaptive.

Thin functional fronts over `functrain.optim`'s stateless clipping transforms (which are
DTensor-aware and sync-free), for use outside an optimizer chain:

- `clip_grad_norm`: scale all gradients by `max_norm / max(norm, max_norm)` (exactly 1 below it).
- `clip_grad_value`: clamp each entry to `[-clip_value, clip_value]`.
- `adaptive_clip_grad` (AGC, Brock et al., 2021): per output unit (a row of a weight, a whole
  bias), scale the gradient down to `threshold * max(|w|, eps)` when its norm exceeds that.
  `eps=0` is Composer's exact rule (a unit whose weights are all zero gets a zero gradient);
  the default `eps=1e-3` (the paper's) lets zero-initialised units learn.
  `apply_gradient_clipping(model, "adaptive", ...)`, Composer's front, uses `eps=0`.

Example:
    >>> grads = {"w": torch.tensor([3.0, 4.0])}
    >>> clip_grad_norm(grads, max_norm=1.0)["w"]
    tensor([0.6000, 0.8000])
"""

from __future__ import annotations

from typing import Any

import torch

from ..optim import EmptyState, adaptive_grad_clip, clip_by_global_norm, clip_by_value, global_norm
from ..optim import unitwise_norm as unitwise_norm

AGC_EPS = 1e-3  # the AGC paper's floor on the weight norm


def global_grad_norm(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all gradients together (0-d float32; DTensors count with their true norm)."""
    return global_norm(grads)


def clip_grad_norm(grads: dict[str, torch.Tensor], max_norm: float) -> dict[str, torch.Tensor]:
    """Gradients scaled so that their global norm is at most `max_norm` > 0 (new tensors)."""
    return clip_by_global_norm(max_norm).update(grads, EmptyState())[0]


def clip_grad_value(grads: dict[str, torch.Tensor], clip_value: float) -> dict[str, torch.Tensor]:
    """Every gradient entry clamped to `[-clip_value, clip_value]` (new tensors)."""
    if clip_value < 0:
        raise ValueError(f"clip_value must be >= 0, got {clip_value}")
    return clip_by_value(clip_value).update(grads, EmptyState())[0]


def adaptive_clip_grad(
    grads: dict[str, torch.Tensor],
    params: dict[str, torch.Tensor],
    clipping_threshold: float,
    eps: float = AGC_EPS,
) -> dict[str, torch.Tensor]:
    """AGC: each unit's gradient norm limited to `clipping_threshold * max(|w_unit|, eps)`.

    Args:
        grads: `{name: grad}`.
        params: `{name: param}` covering `grads`' names (extra entries are ignored).
        clipping_threshold: the largest allowed ratio of gradient norm to weight norm (>= 0).
        eps: floor on the weight norm.
    Returns:
        the clipped gradients (new tensors).
    """
    if clipping_threshold < 0:
        raise ValueError(f"clipping_threshold must be >= 0, got {clipping_threshold}")
    missing = [k for k in grads if k not in params]
    if missing:
        raise KeyError(
            f"adaptive clipping needs the parameters of every gradient; missing {missing[:3]}"
        )
    subset = {k: params[k] for k in grads}
    return adaptive_grad_clip(clipping_threshold, eps).update(grads, EmptyState(), subset)[0]


CLIPPING_TYPES = ("adaptive", "norm", "value")


def apply_gradient_clipping(
    model: Any,
    clipping_type: str,
    clipping_threshold: float,
    fsdp_enabled: bool = False,
) -> dict[str, torch.Tensor]:
    """Composer's `apply_gradient_clipping`, pure: the clipped gradients, nothing modified.

    Composer clips every `p.grad` of the model in place; this returns them clipped instead (write
    them back with `p.grad.copy_(...)` if a plain PyTorch loop needs it; inside functrain, compose
    `functrain.algorithms.gradient_clipping` into the step). "adaptive" is Composer's rule
    exactly: no floor on the weight norm, so a unit whose weights are all zero gets a zero
    gradient (`adaptive_clip_grad`'s default floor of 1e-3 would let it through).

    Args:
        model: an `nn.Module` whose parameters hold `.grad`, or `{name: grad}` ("adaptive" then
            needs a module, for the weights).
        clipping_type: "norm" (global norm), "value" (elementwise) or "adaptive" (AGC).
        clipping_threshold: the norm, the value, or AGC's gradient-to-weight ratio.
        fsdp_enabled: Composer's argument; sharded gradients are handled by functrain's step, so
            it changes nothing here.
    Returns:
        `{name: clipped grad}` (new tensors) for the parameters that have a gradient.
    Example:
        >>> apply_gradient_clipping({"w": torch.tensor([3.0, 4.0])}, "norm", 1.0)["w"]
        tensor([0.6000, 0.8000])
    """
    del fsdp_enabled
    if clipping_type not in CLIPPING_TYPES:
        raise ValueError(f"clipping_type must be one of {CLIPPING_TYPES}, got {clipping_type!r}")
    if isinstance(model, torch.nn.Module):
        named = dict(model.named_parameters())
        grads = {k: p.grad.detach() for k, p in named.items() if p.grad is not None}
        params = {k: p.detach() for k, p in named.items()}
    else:
        grads, params = dict(model), None
    if clipping_type == "norm":
        return clip_grad_norm(grads, clipping_threshold)
    if clipping_type == "value":
        return clip_grad_value(grads, clipping_threshold)
    if params is None:
        raise TypeError("adaptive clipping needs the weights: pass the nn.Module, not gradients")
    return adaptive_clip_grad(grads, params, clipping_threshold, eps=0.0)
