"""Momentum (`trace`) and the SGD optimizers: `sgd` (torch.optim.SGD) and `decoupled_sgdw` (Composer).

`trace` follows torch's momentum buffer exactly: the first update sets the buffer to the gradient
itself, later ones do `buf = momentum * buf + (1 - dampening) * grad`; Nesterov returns
`grad + momentum * buf`.

Example:
    >>> opt = sgd(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..tree import tree_map, tree_unflatten
from ._foreach import (
    check_number,
    copy_into,
    donating,
    flatten,
    foreach_op,
    leaves_matching,
    owns_temporaries,
    update_math,
)
from .base import Transform, chain, maybe_differentiable
from .masking import masked_passthrough
from .scale import (
    ScalarOrSchedule,
    add_decayed_weights,
    add_decoupled_weight_decay,
    scale_by_learning_rate,
)
from .spec import MomentumSpec


class TraceState(NamedTuple):
    """`count`: updates done (Python int; 0 means the buffer is not started); `momentum`: buffers."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    momentum: Any


def trace(decay: float, nesterov: bool = False, dampening: float = 0.0) -> Transform:
    """Momentum with torch.optim.SGD's semantics.

    Args:
        decay: the momentum factor.
        nesterov: return `grad + decay * buf` instead of `buf`.
        dampening: the buffer adds `(1 - dampening) * grad` (not on the first update).
    Returns:
        a `Transform` with `TraceState(count, momentum)`.
    Example:
        >>> opt = chain(trace(0.9), scale_by_learning_rate(0.1))
    """
    check_number("momentum", decay)
    check_number("dampening", dampening)
    decay, dampening = float(decay), float(dampening)

    def init(params):
        return TraceState(count=0, momentum=tree_map(torch.zeros_like, params))

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        donate = donating(extra)
        leaves, spec = flatten(grads)
        buf = leaves_matching(state.momentum, spec, "trace: the momentum buffers")
        if state.count == 0:
            # torch starts the buffer at the gradient itself (no dampening on the first step).
            # Copied into the buffer's own layout, not the gradient's: a transposed gradient
            # must not make the state non-contiguous (the fused kernels need it laid out like
            # its parameter).
            if owns_temporaries(extra):
                fresh = buf if donate else [torch.empty_like(b) for b in buf]
                buf = copy_into(fresh, leaves)
            else:  # differentiable: a graph-connected copy
                buf = foreach_op("clone", leaves)
        else:
            buf = foreach_op("mul", buf, decay, inplace=donate)
            buf = foreach_op(
                "add", buf, leaves, alpha=1.0 - dampening, inplace=owns_temporaries(extra)
            )
        if nesterov:
            out = foreach_op("add", leaves, buf, alpha=decay, inplace=donate)
        else:
            # The updates must never alias the state: later transforms may scale them in place.
            out = copy_into(leaves, buf) if donate else foreach_op("clone", buf)
        return tree_unflatten(spec, out), TraceState(state.count + 1, tree_unflatten(spec, buf))

    return Transform(init, update, MomentumSpec(decay, bool(nesterov), dampening))


def _check_momentum(momentum: Any, dampening: Any, nesterov: bool) -> None:
    check_number("momentum", momentum)
    check_number("dampening", dampening)
    if nesterov and (float(momentum) <= 0 or float(dampening) != 0):
        raise ValueError(
            "nesterov momentum requires momentum > 0 and dampening = 0 (as in torch.optim.SGD)"
        )


def sgd(
    lr: ScalarOrSchedule,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    *,
    weight_decay_mask: Any = None,
    differentiable: bool = False,
) -> Transform:
    """Stochastic gradient descent with exactly torch.optim.SGD's semantics.

    `d = grad + weight_decay * param`; with momentum, `buf` follows `trace`; the step is `-lr * d`.

    Args:
        lr: learning rate, a number or a schedule `t -> lr` (the value itself, not a multiplier).
        momentum: momentum factor (0 disables the buffer: no state is kept).
        dampening: momentum dampening.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening 0).
        weight_decay: L2 coefficient added to the gradient.
        weight_decay_mask: optional `{name: bool}` or `params -> {name: bool}` (e.g.
            `no_decay_mask`); names mapped to False get no weight decay.
    Returns:
        a `Transform`; state `(EmptyState|MaskedState, [TraceState], ScaleByLearningRateState)`.
        differentiable: the update as an autograd op (see `functrain.optim.differentiable`).
    Example:
        >>> opt = sgd(0.1, momentum=0.9, weight_decay=5e-4, weight_decay_mask=no_decay_mask)
    """
    check_number("lr", lr, schedule=True)
    _check_momentum(momentum, dampening, nesterov)
    parts = [masked_passthrough(add_decayed_weights(weight_decay), weight_decay_mask)]
    if float(momentum) != 0.0:
        parts.append(trace(momentum, nesterov=nesterov, dampening=dampening))
    parts.append(scale_by_learning_rate(lr))
    return maybe_differentiable(chain(*parts), differentiable)


def decoupled_sgdw(
    lr: ScalarOrSchedule,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    *,
    initial_lr: float | None = None,
    weight_decay_mask: Any = None,
    differentiable: bool = False,
) -> Transform:
    """SGD with weight decay decoupled from the learning rate (Composer's `DecoupledSGDW`).

    Momentum acts on the raw gradient; then
    `param <- param * (1 - weight_decay * lr_t / initial_lr) - lr_t * d`.

    Args:
        lr: learning rate, a number or a schedule `t -> lr`.
        momentum, dampening, nesterov: as in `sgd`.
        weight_decay: decoupled decay; a parameter shrinks by `1 - weight_decay` per step at
            the initial learning rate (so it is typically much smaller than `sgd`'s).
        initial_lr: the base learning rate the decay is relative to; read from `lr` when it
            names one (a number, or `base * schedule`), required only for a plain function.
            Under `inject_hyperparams` it is read from the scheduled `lr` the same way.
        weight_decay_mask: as in `sgd`.
        differentiable: the update as an autograd op (see `functrain.optim.differentiable`).
    Example:
        >>> opt = decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-5)
    """
    check_number("lr", lr, schedule=True)
    _check_momentum(momentum, dampening, nesterov)
    parts = []
    if float(momentum) != 0.0:
        parts.append(trace(momentum, nesterov=nesterov, dampening=dampening))
    parts.append(scale_by_learning_rate(lr))
    decay = add_decoupled_weight_decay(weight_decay, lr, initial_lr)
    parts.append(masked_passthrough(decay, weight_decay_mask))
    return maybe_differentiable(chain(*parts), differentiable)
