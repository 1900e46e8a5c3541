"""Gradient clipping: by global norm, by value, and adaptive (unit-wise, NFNets) clipping.

All three keep no state and never sync with the host: the global-norm scale is a 0-d tensor.

Example:
    >>> opt = chain(clip_by_global_norm(1.0), adamw(1e-3))
    >>> opt = chain(adaptive_grad_clip(0.01), sgd(0.1, momentum=0.9))
"""

from __future__ import annotations

import math

import torch

from ..tree import tree_unflatten
from ._foreach import (
    check_number,
    differentiating,
    donating,
    flatten,
    foreach_op,
    owns_temporaries,
    params_like,
    update_math,
)
from .base import EmptyState, Transform, global_norm
from .spec import ClipByGlobalNormSpec


def _no_state(params):
    del params
    return EmptyState()


def clip_by_global_norm(max_norm: float) -> Transform:
    """Scale all updates together so that their global L2 norm is at most `max_norm`.

    Below the threshold the updates are multiplied by exactly 1.0 (unchanged); above it by
    `max_norm / norm`. DTensor leaves count with their true (cross-shard) norm.

    Args:
        max_norm: the largest allowed global norm (> 0).
    Example:
        >>> opt = chain(clip_by_global_norm(1.0), sgd(0.1))
    """
    check_number("max_norm", max_norm)
    if float(max_norm) <= 0:
        raise ValueError(f"clip_by_global_norm needs max_norm > 0, got {max_norm}")
    max_norm = float(max_norm)

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        leaves, spec = flatten(grads)
        if not leaves:
            return grads, state
        if differentiating(extra):  # the norm on the tape too (global_norm runs without it)
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(x) for x in leaves])
            )
        else:
            norm = global_norm(leaves)
        # max_norm / max(norm, max_norm) is 1.0 exactly below the threshold, so no branch (and
        # no host sync) is needed. Tensor / tensor: `scalar / tensor` is computed as
        # scalar * reciprocal(tensor), which is not exactly 1.
        factor = torch.full_like(norm, max_norm) / torch.clamp(norm, min=max_norm)
        if differentiating(extra):  # a foreach op takes no scalar tensor with a history
            return tree_unflatten(spec, [x * factor for x in leaves]), state
        out = foreach_op("mul", leaves, factor.to(leaves[0].device), inplace=donating(extra))
        return tree_unflatten(spec, out), state

    return Transform(_no_state, update, ClipByGlobalNormSpec(max_norm))


def clip_by_value(
    limit: float | None = None, *, min: float | None = None, max: float | None = None
) -> Transform:
    """Clamp every element of the updates to `[-limit, limit]`, or to `[min, max]`.

    Args:
        limit: symmetric bound (> 0); give either it or `min`/`max`.
        min, max: explicit bounds (either may be None for a one-sided clamp).
    Example:
        >>> opt = chain(clip_by_value(0.5), sgd(0.1))
        >>> opt = chain(clip_by_value(min=-1.0, max=0.5), sgd(0.1))
    """
    if limit is not None:
        if min is not None or max is not None:
            raise ValueError("clip_by_value: give either limit or min/max, not both")
        check_number("limit", limit)
        low: float | None = -float(limit)
        high: float | None = float(limit)
    else:
        if min is None and max is None:
            raise ValueError("clip_by_value needs limit=, or min= and/or max=")
        for name, bound in (("min", min), ("max", max)):
            if bound is not None:
                check_number(name, bound, low=-math.inf)
        low = None if min is None else float(min)
        high = None if max is None else float(max)
        if low is not None and high is not None and low > high:
            raise ValueError(f"clip_by_value: min={low} is larger than max={high}")

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        donate = donating(extra)
        leaves, spec = flatten(grads)
        out = leaves
        if low is not None:
            out = foreach_op("clamp_min", out, low, inplace=donate)
        if high is not None:
            # After the first op `out` is ours whenever it is a fresh list.
            mine = out is not leaves and owns_temporaries(extra)
            out = foreach_op("clamp_max", out, high, inplace=donate or mine)
        return tree_unflatten(spec, out), state

    return Transform(_no_state, update)


def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """The L2 norm per output unit: over all dims but the first (whole tensor if ndim <= 1).

    Returns a tensor broadcastable against `x` (keepdim for ndim >= 2, 0-d otherwise).
    """
    if x.ndim <= 1:
        return torch.linalg.vector_norm(x)
    return torch.linalg.vector_norm(x, dim=tuple(range(1, x.ndim)), keepdim=True)


def adaptive_grad_clip(clipping: float = 0.01, eps: float = 1e-3) -> Transform:
    """Adaptive gradient clipping (AGC, Brock et al. 2021, "NFNets"), unit-wise.

    For each output unit `i` of each parameter (a row of a Linear weight, a filter of a Conv;
    a whole bias or scalar): `max_i = clipping * max(||W_i||, eps)`; if `||G_i|| > max_i` the
    unit's gradient is scaled to norm `max_i`, else kept. With `eps=0` this is exactly
    Composer's adaptive clipping (`clipping_type="adaptive"`), where a zero gradient stays zero.

    Args:
        clipping: the largest allowed ratio of gradient norm to parameter norm.
        eps: floor on the parameter norm, so that zero-initialised units can still move.
    Returns:
        a `Transform` that needs `params` in `update`.
    Example:
        >>> opt = chain(adaptive_grad_clip(0.01), sgd(0.1, momentum=0.9))
    """
    check_number("clipping", clipping)
    check_number("eps", eps)
    clipping, eps = float(clipping), float(eps)

    @update_math
    def update(grads, state, params=None, **extra):
        donate = donating(extra)
        leaves, spec = flatten(grads)
        ps = params_like(grads, params, spec, "adaptive_grad_clip")
        out = []
        for g, p in zip(leaves, ps):
            max_norm = unitwise_norm(p).clamp(min=eps) * clipping
            # 0/0 (zero gradient, zero weight, eps 0) -> nan -> 1; x/0 -> inf -> clamped to 1.
            coeff = (max_norm / unitwise_norm(g)).nan_to_num(nan=1.0).clamp(max=1.0)
            out.append(g.mul_(coeff) if donate else g * coeff)
        return tree_unflatten(spec, out), state

    return Transform(_no_state, update)
