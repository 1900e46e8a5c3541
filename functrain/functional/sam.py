"""Sharpness-aware minimization (Foret et al., 2021): the ascent step.

SAM takes the gradient at `w + e(w)`, where `e(w) = rho * g / (|g| + epsilon)` moves the weights
uphill along the current gradient `g` (global L2 norm). `sam_perturbation` computes `e(w)`;
`perturb` adds it. The `sam` algorithm runs both gradient computations.

Example:
    >>> e = sam_perturbation({"w": torch.tensor([3.0, 4.0])}, rho=0.5)
    >>> e["w"]
    tensor([0.3000, 0.4000])
"""

from __future__ import annotations

import torch

from .. import _torch
from .gradient_clipping import global_grad_norm


def sam_perturbation(
    grads: dict[str, torch.Tensor], rho: float = 0.05, epsilon: float = 1e-12
) -> dict[str, torch.Tensor]:
    """`e(w) = rho * g / (|g| + epsilon)` for every gradient (new tensors).

    Args:
        grads: `{name: grad}` at the current weights.
        rho: radius of the neighbourhood (0: no perturbation).
        epsilon: guards the division when the gradient vanishes.
    Returns:
        `{name: perturbation}` whose global norm is `rho` (or less, for tiny gradients).
    """
    if rho < 0 or epsilon < 0:
        raise ValueError(f"SAM needs rho >= 0 and epsilon >= 0, got rho={rho}, epsilon={epsilon}")
    if not grads:
        return {}
    names = list(grads)
    scale = rho / (global_grad_norm(grads) + epsilon)
    scale = scale.to(grads[names[0]].device)
    if _torch.functorch_transforms_active():  # vmap: no batching rule for foreach kernels
        scaled = [grads[k] * scale for k in names]
    else:
        scaled = _torch.foreach_mul([grads[k] for k in names], scale)
    return dict(zip(names, scaled))


def perturb(
    params: dict[str, torch.Tensor], delta: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """`params` with `delta` added where it has an entry (new tensors; others shared)."""
    return {k: (p + delta[k].to(p.dtype)) if k in delta else p for k, p in params.items()}
