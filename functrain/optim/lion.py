"""Lion (EvoLved Sign Momentum, Chen et al. 2023): `scale_by_lion` and the `lion` optimizer.

    update = sign(b1 * mu + (1 - b1) * g);  mu <- b2 * mu + (1 - b2) * g
    param  <- param - lr * (update + weight_decay * param)

Lion's updates have unit size per element, so its learning rate is typically 3-10x smaller than
AdamW's and its weight decay correspondingly larger.

Example:
    >>> opt = lion(lr=1e-4, weight_decay=1.0)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..tree import tree_map, tree_unflatten
from ._foreach import (
    check_number,
    donating,
    flatten,
    foreach_op,
    leaves_matching,
    owns_temporaries,
    update_math,
)
from .base import Transform, chain, maybe_differentiable
from .masking import masked_passthrough
from .scale import ScalarOrSchedule, add_decayed_weights, scale_by_learning_rate
from .spec import LionSpec


class ScaleByLionState(NamedTuple):
    """`count`: updates done (Python int); `mu`: the momentum."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    mu: Any


def scale_by_lion(b1: float = 0.9, b2: float = 0.99) -> Transform:
    """The sign of an interpolation of momentum and gradient; the momentum decays with `b2`.

    Args:
        b1: interpolation factor for the update direction.
        b2: decay of the momentum.
    Returns:
        a `Transform` with `ScaleByLionState(count, mu)`.
    Example:
        >>> opt = chain(scale_by_lion(), scale_by_learning_rate(1e-4))
    """
    check_number("beta1", b1, high=1.0)
    check_number("beta2", b2, high=1.0)
    b1, b2 = float(b1), float(b2)

    def init(params):
        return ScaleByLionState(0, tree_map(torch.zeros_like, params))

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        donate = donating(extra)
        g, spec = flatten(grads)
        mu = leaves_matching(state.mu, spec, "scale_by_lion: mu")
        # The direction needs the old momentum, so it is built before mu moves.
        own = owns_temporaries(extra)
        direction = foreach_op("sign", foreach_op("lerp", mu, g, 1.0 - b1), inplace=own)
        mu = foreach_op("lerp", mu, g, 1.0 - b2, inplace=donate)
        return tree_unflatten(spec, direction), ScaleByLionState(
            state.count + 1, tree_unflatten(spec, mu)
        )

    return Transform(init, update, LionSpec(b1, b2))


def lion(
    lr: ScalarOrSchedule = 1e-4,
    betas: tuple[float, float] = (0.9, 0.99),
    weight_decay: float = 0.0,
    *,
    weight_decay_mask: Any = None,
    differentiable: bool = False,
) -> Transform:
    """The Lion optimizer (decay multiplied by the learning rate, as in the paper).

    Args:
        lr: learning rate, a number or a schedule `t -> lr`.
        betas: `(b1, b2)` of `scale_by_lion`.
        weight_decay: decoupled decay coefficient (times lr).
        weight_decay_mask: optional `{name: bool}` or `params -> {name: bool}`; False = no decay.
        differentiable: the update as an autograd op (see `functrain.optim.differentiable`).
    Example:
        >>> opt = lion(3e-5, weight_decay=0.1)
    """
    check_number("lr", lr, schedule=True)
    b1, b2 = betas
    return maybe_differentiable(
        chain(
            scale_by_lion(b1, b2),
            masked_passthrough(add_decayed_weights(weight_decay), weight_decay_mask),
            scale_by_learning_rate(lr),
        ),
        differentiable,
    )
