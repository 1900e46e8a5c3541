"""Scaling transforms: `scale`, `scale_by_learning_rate`, and the two kinds of weight decay.

`add_decayed_weights(wd)` adds `wd * param` to the update (coupled: it is then multiplied by the
learning rate, as in torch's SGD/Adam L2 term or AdamW's decay when placed before the lr).
`add_decoupled_weight_decay(wd, lr, initial_lr)` goes *after* the learning rate and subtracts
`wd * (lr_t / initial_lr) * param`: Composer's decoupled decay, which follows the schedule's shape
but not the size of the learning rate.

Example:
    >>> opt = chain(scale_by_adam(), add_decayed_weights(1e-2), scale_by_learning_rate(1e-3))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..tree import tree_unflatten
from ._foreach import (
    check_number,
    donating,
    flatten,
    foreach_op,
    hyperparam_value,
    params_like,
    start_value,
    update_math,
)
from .base import EmptyState, Transform
from .spec import DecoupledWeightDecaySpec, LearningRateSpec, ScaleSpec, WeightDecaySpec

ScalarOrSchedule = float | Callable[[Any], float]


def scale(factor: float) -> Transform:
    """Multiply the updates by a constant `factor`.

    Example:
        >>> updates, _ = scale(-0.1).update(grads, EmptyState())
    """
    check_number("factor", factor, low=-math.inf)
    factor = float(factor)

    def init(params):
        del params
        return EmptyState()

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        leaves, spec = flatten(grads)
        return tree_unflatten(
            spec, foreach_op("mul", leaves, factor, inplace=donating(extra))
        ), state

    return Transform(init, update, ScaleSpec(factor))


class ScaleByLearningRateState(NamedTuple):
    """`count`: updates done (Python int); `lr`: the learning rate last used (Python float)."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    lr: float


def scale_by_learning_rate(lr: ScalarOrSchedule, *, flip_sign: bool = True) -> Transform:
    """Multiply the updates by `-lr` (by `lr` if `flip_sign=False`).

    Args:
        lr: a number, or a schedule `schedule(t) -> float` evaluated at `extra["time"]` (a
            Timestamp) when the update is given one, else at this transform's own update count.
        flip_sign: negate, so that `apply_updates` descends (the optax convention).
    Returns:
        a `Transform` with `ScaleByLearningRateState(count, lr)`; `lr` is the value last used
        (before the first update: the schedule at t=0).
    Example:
        >>> t = scale_by_learning_rate(lambda t: 0.1 / (1 + t))
    """
    check_number("lr", lr, schedule=True)
    sign = -1.0 if flip_sign else 1.0

    def init(params):
        del params
        return ScaleByLearningRateState(count=0, lr=start_value(lr))

    @update_math
    def update(grads, state, params=None, **extra):
        del params
        new_state = next_lr_state(lr, state, extra)
        leaves, spec = flatten(grads)
        out = foreach_op("mul", leaves, sign * new_state.lr, inplace=donating(extra))
        return tree_unflatten(spec, out), new_state

    return Transform(init, update, LearningRateSpec(lr, sign))


def next_lr_state(
    lr: ScalarOrSchedule, state: ScaleByLearningRateState, extra: Mapping[str, Any]
) -> ScaleByLearningRateState:
    """`scale_by_learning_rate`'s state transition: this update's lr (a schedule evaluated at
    `extra["time"]`, else at the count) and the count advanced. Written once, for both the
    transform's `update` and the fused kernels (`functrain.optim.kernels`).

    Example:
        >>> next_lr_state(0.1, ScaleByLearningRateState(0, 0.1), {})
        ScaleByLearningRateState(count=1, lr=0.1)
    """
    return ScaleByLearningRateState(state.count + 1, hyperparam_value(lr, state.count, extra, "lr"))


def add_decayed_weights(weight_decay: float = 0.0) -> Transform:
    """Add `weight_decay * param` to the updates (an L2 term; identity when it is 0).

    Args:
        weight_decay: the coefficient (a number; schedule it with `inject_hyperparams`).
    Example:
        >>> opt = chain(add_decayed_weights(5e-4), scale_by_learning_rate(0.1))  # torch SGD L2
    """
    check_number("weight_decay", weight_decay)
    weight_decay = float(weight_decay)

    def init(params):
        del params
        return EmptyState()

    @update_math
    def update(grads, state, params=None, **extra):
        if weight_decay == 0.0:
            return grads, state
        leaves, spec = flatten(grads)
        ps = params_like(grads, params, spec, "add_decayed_weights")
        out = foreach_op("add", leaves, ps, alpha=weight_decay, inplace=donating(extra))
        return tree_unflatten(spec, out), state

    return Transform(init, update, WeightDecaySpec(weight_decay))


class DecoupledWeightDecayState(NamedTuple):
    """`count`: updates done (int); `factor`: the last `lr_t / initial_lr` used (float)."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    factor: float


def add_decoupled_weight_decay(
    weight_decay: float,
    lr: ScalarOrSchedule,
    initial_lr: float | None = None,
) -> Transform:
    """Subtract `weight_decay * (lr_t / initial_lr) * param` (Composer's decoupled decay).

    Place it *after* `scale_by_learning_rate`: the decay is not multiplied by the learning rate,
    only by its schedule's ratio `lr_t / initial_lr` (so a parameter shrinks by the factor
    `1 - weight_decay` per step at the initial learning rate). As in Composer, an `initial_lr`
    of 0 makes the ratio 1.

    Args:
        weight_decay: the decoupled coefficient.
        lr: the same learning rate (number or schedule) given to `scale_by_learning_rate`.
        initial_lr: the base lr the schedule is relative to. By default it is read from `lr`:
            the number itself, the factor of a scaled schedule (`1e-3 * cosine_annealing()`
            names 1e-3), or 1 for a bare functrain schedule (whose values are multipliers of
            1); only a plain function of time leaves it unknown, and then it is required.
    Example:
        >>> opt = chain(trace(0.9), scale_by_learning_rate(0.1 * cosine_annealing()),
        ...             add_decoupled_weight_decay(1e-4, lr=0.1 * cosine_annealing()))
    """
    check_number("weight_decay", weight_decay)
    check_number("lr", lr, schedule=True)
    weight_decay = float(weight_decay)
    base = _initial_lr(lr, initial_lr)

    def init(params):
        del params
        # start_value: a warm-up in epochs or "dur" resolves without the run's horizon at t=0.
        return DecoupledWeightDecayState(count=0, factor=start_value(lr) / base if base else 1.0)

    @update_math
    def update(grads, state, params=None, **extra):
        new_state = next_decay_state(lr, base, state, extra)
        factor = new_state.factor
        if weight_decay == 0.0:
            return grads, new_state
        leaves, spec = flatten(grads)
        ps = params_like(grads, params, spec, "add_decoupled_weight_decay")
        out = foreach_op("add", leaves, ps, alpha=-weight_decay * factor, inplace=donating(extra))
        return tree_unflatten(spec, out), new_state

    return Transform(init, update, DecoupledWeightDecaySpec(weight_decay, lr, base))


def next_decay_state(
    lr: ScalarOrSchedule, base: float, state: DecoupledWeightDecayState, extra: Mapping[str, Any]
) -> DecoupledWeightDecayState:
    """`add_decoupled_weight_decay`'s state transition: this update's `lr_t / base` (1 when
    `base` is 0, as in Composer) and the count advanced. Written once, for both the transform's
    `update` and the fused kernels.

    Example:
        >>> next_decay_state(0.05, 0.1, DecoupledWeightDecayState(0, 1.0), {})
        DecoupledWeightDecayState(count=1, factor=0.5)
    """
    factor = hyperparam_value(lr, state.count, extra, "lr") / base if base else 1.0
    return DecoupledWeightDecayState(state.count + 1, factor)


def base_lr(lr: ScalarOrSchedule) -> float | None:
    """The base learning rate `lr` names, or None when it cannot be known.

    A number is its own base; `factor * schedule` (a `functrain.schedules.Scaled`) names
    `factor`; a bare functrain `Schedule` gives multipliers of 1. A plain function of time says
    nothing about its base.

    Example:
        >>> base_lr(0.1 * cosine_annealing()), base_lr(0.1), base_lr(lambda t: 0.1)
        (0.1, 0.1, None)
    """
    from ..schedules import Scaled, Schedule

    if isinstance(lr, Scaled):
        return lr.factor
    if isinstance(lr, Schedule):
        return 1.0
    if callable(lr):
        return None
    return float(lr)


def _initial_lr(lr: ScalarOrSchedule, initial_lr: float | None) -> float:
    if initial_lr is not None:
        check_number("initial_lr", initial_lr)
        return float(initial_lr)
    base = base_lr(lr)
    if base is None:
        raise ValueError(
            "decoupled weight decay with a learning rate given as a plain function needs "
            "initial_lr=, the base learning rate the decay is relative to; or write the "
            "schedule as `base * schedule` with a functrain.schedules schedule (e.g. "
            "lr=1e-3 * cosine_annealing()), which names its base"
        )
    return base
