"""Adam: `scale_by_adam`, and the optimizers `adam`, `adamw` (torch) and `decoupled_adamw` (Composer).

`scale_by_adam` follows torch.optim.Adam's arithmetic step by step (same order of operations), so
`adam`/`adamw` reproduce torch to float rounding:

    mu <- lerp(mu, g, 1 - b1);  nu <- b2 * nu + (1 - b2) * g * g;  (amsgrad: nu_max <- max(nu_max, nu))
    update = (mu / (sqrt(nu) / sqrt(1 - b2^t) + eps)) / (1 - b1^t)

The bias-correction step `t` is `count + 1`, with `count` a plain Python int in the state.

Example:
    >>> opt = adamw(lr=3e-4, weight_decay=0.1, weight_decay_mask=no_decay_mask)
"""

from __future__ import annotations

import math
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
from .spec import AdamSpec


class ScaleByAdamState(NamedTuple):
    """`count`: updates done (Python int); `mu`, `nu`: first and second moments."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    mu: Any
    nu: Any


class ScaleByAmsgradState(NamedTuple):
    """`ScaleByAdamState` plus `nu_max`, the running maximum of `nu` (AMSGrad)."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    mu: Any
    nu: Any
    nu_max: Any


def scale_by_adam(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, amsgrad: bool = False
) -> Transform:
    """Rescale updates by Adam's bias-corrected moment estimates (torch's formula).

    Args:
        b1, b2: decay rates of the first and second moments, in [0, 1).
        eps: added to the denominator after the bias correction of its square root.
        amsgrad: normalise by the running maximum of the second moment.
    Returns:
        a `Transform` with `ScaleByAdamState` (or `ScaleByAmsgradState`).
    Example:
        >>> opt = chain(scale_by_adam(), scale_by_learning_rate(1e-3))  # torch.optim.Adam
    """
    check_number("beta1", b1, high=1.0)
    check_number("beta2", b2, high=1.0)
    check_number("eps", eps)
    b1, b2, eps = float(b1), float(b2), float(eps)

    def init(params):
        mu = tree_map(torch.zeros_like, params)
        nu = tree_map(torch.zeros_like, params)
        if amsgrad:
            return ScaleByAmsgradState(0, mu, nu, tree_map(torch.zeros_like, params))
        return ScaleByAdamState(0, mu, nu)

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        donate, own = donating(extra), owns_temporaries(extra)
        g, spec = flatten(grads)
        mu = leaves_matching(state.mu, spec, "scale_by_adam: mu")
        nu = leaves_matching(state.nu, spec, "scale_by_adam: nu")
        step = state.count + 1
        mu = foreach_op("lerp", mu, g, 1.0 - b1, inplace=donate)
        nu = foreach_op("mul", nu, b2, inplace=donate)
        nu = foreach_op("addcmul", nu, g, g, value=1.0 - b2, inplace=own)
        second = nu
        nu_max = None
        if amsgrad:
            nu_max = leaves_matching(state.nu_max, spec, "scale_by_adam: nu_max")
            nu_max = foreach_op("maximum", nu_max, nu, inplace=donate)
            second = nu_max
        # One temporary list, as torch's own foreach Adam allocates: the denominator.
        denom = foreach_op("sqrt", second)
        correction1, correction2 = _bias_corrections(b1, b2, step)
        denom = foreach_op("div", denom, correction2, inplace=own)
        denom = foreach_op("add", denom, eps, inplace=own)
        out = (
            foreach_op("div", copy_into(g, mu), denom, inplace=True)
            if donate
            else foreach_op("div", mu, denom)
        )
        out = foreach_op("div", out, correction1, inplace=own)
        mu_tree, nu_tree = tree_unflatten(spec, mu), tree_unflatten(spec, nu)
        if amsgrad:
            new_state = ScaleByAmsgradState(step, mu_tree, nu_tree, tree_unflatten(spec, nu_max))
        else:
            new_state = ScaleByAdamState(step, mu_tree, nu_tree)
        return tree_unflatten(spec, out), new_state

    return Transform(init, update, AdamSpec(b1, b2, eps, bool(amsgrad)))


def _bias_corrections(b1: float, b2: float, step: Any) -> tuple[Any, Any]:
    """`1 - b1**t` and `sqrt(1 - b2**t)`: Python floats, or for a count that a guard deciding
    on the device keeps as a tensor, 0-d float64 tensors of the same values (no host read)."""
    if isinstance(step, torch.Tensor):
        t = step.to(torch.float64)
        return 1.0 - b1**t, torch.sqrt(1.0 - b2**t)
    return 1.0 - b1**step, math.sqrt(1.0 - b2**step)


def adam(
    lr: ScalarOrSchedule = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    *,
    weight_decay_mask: Any = None,
    differentiable: bool = False,
) -> Transform:
    """Adam with torch.optim.Adam's semantics (weight decay is an L2 term added to the gradient).

    Args:
        lr: learning rate, a number or a schedule `t -> lr`.
        betas: `(b1, b2)`.
        eps: denominator term.
        weight_decay: L2 coefficient.
        amsgrad: the AMSGrad variant.
        weight_decay_mask: optional `{name: bool}` or `params -> {name: bool}`; False = no decay.
        differentiable: the update as an autograd op (see `functrain.optim.differentiable`).
    Example:
        >>> opt = adam(1e-3)
    """
    check_number("lr", lr, schedule=True)
    b1, b2 = betas
    return maybe_differentiable(
        chain(
            masked_passthrough(add_decayed_weights(weight_decay), weight_decay_mask),
            scale_by_adam(b1, b2, eps, amsgrad),
            scale_by_learning_rate(lr),
        ),
        differentiable,
    )


def adamw(
    lr: ScalarOrSchedule = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    amsgrad: bool = False,
    *,
    weight_decay_mask: Any = None,
    differentiable: bool = False,
) -> Transform:
    """AdamW with torch.optim.AdamW's semantics: `param <- param * (1 - lr * wd) - lr * adam`.

    Args:
        lr: learning rate, a number or a schedule `t -> lr`.
        betas, eps, amsgrad: as in `adam`.
        weight_decay: decay coefficient, multiplied by the learning rate.
        weight_decay_mask: optional `{name: bool}` or `params -> {name: bool}`; False = no decay.
        differentiable: the update as an autograd op (see `functrain.optim.differentiable`).
    Example:
        >>> opt = adamw(3e-4, weight_decay=0.1, weight_decay_mask=no_decay_mask)
    """
    check_number("lr", lr, schedule=True)
    b1, b2 = betas
    return maybe_differentiable(
        chain(
            scale_by_adam(b1, b2, eps, amsgrad),
            masked_passthrough(add_decayed_weights(weight_decay), weight_decay_mask),
            scale_by_learning_rate(lr),
        ),
        differentiable,
    )


def decoupled_adamw(
    lr: ScalarOrSchedule = 1e-3,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 1e-5,
    amsgrad: bool = False,
    *,
    initial_lr: float | None = None,
    weight_decay_mask: Any = None,
    differentiable: bool = False,
) -> Transform:
    """Composer's `DecoupledAdamW`: the decay follows the lr schedule but not the lr's size.

    `param <- param * (1 - weight_decay * lr_t / initial_lr) - lr_t * adam` (defaults as in
    Composer: betas (0.9, 0.95), weight_decay 1e-5).

    Args:
        lr: learning rate, a number or a schedule `t -> lr`.
        betas, eps, amsgrad: as in `adam`.
        weight_decay: decoupled decay per step at the initial learning rate.
        initial_lr: the base learning rate the decay is relative to; read from `lr` when it
            names one (a number, or `base * schedule`), required only for a plain function.
            Under `inject_hyperparams` it is read from the scheduled `lr` the same way.
        weight_decay_mask: optional `{name: bool}` or `params -> {name: bool}`; False = no decay.
        differentiable: the update as an autograd op (see `functrain.optim.differentiable`).
    Example:
        >>> opt = decoupled_adamw(1e-3 * cosine_annealing_with_warmup("1ep"))  # base 1e-3
    """
    check_number("lr", lr, schedule=True)
    b1, b2 = betas
    return maybe_differentiable(
        chain(
            scale_by_adam(b1, b2, eps, amsgrad),
            scale_by_learning_rate(lr),
            masked_passthrough(
                add_decoupled_weight_decay(weight_decay, lr, initial_lr), weight_decay_mask
            ),
        ),
        differentiable,
    )
