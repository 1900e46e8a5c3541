"""`multi_steps`: gradient accumulation as a transform.

The wrapped optimizer steps once every `every_k` calls, on the mean of the `every_k` gradients;
the calls in between return zero updates and leave its state (its step count, its moments)
untouched. With equal-sized micro-batches and a mean loss, k accumulated calls equal one step on
the concatenated batch.

Example:
    >>> opt = multi_steps(adamw(1e-3), every_k=4)
    >>> state = opt.init(params)
    >>> for batch in batches:
    ...     updates, state = opt.update(grads_of(batch), state, params)
    ...     params = apply_updates(params, updates)  # moves every 4th call only
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..tree import tree_map, tree_unflatten
from ._foreach import (
    donating,
    flatten,
    foreach_op,
    grad_mode,
    leaves_matching,
    owns_temporaries,
    zeros_like,
)
from .base import Transform


class MultiStepsState(NamedTuple):
    """`mini_step`: calls since the last real step (int); `grad_acc`: their gradient sum;
    `inner_state`: the wrapped optimizer's state."""

    mini_step: int
    grad_acc: Any
    inner_state: Any


def multi_steps(inner: Transform, every_k: int) -> Transform:
    """Accumulate gradients over `every_k` calls and step `inner` on their mean.

    Args:
        inner: the optimizer to step.
        every_k: number of calls per real step (>= 1).
    Returns:
        a `Transform` with `MultiStepsState(mini_step, grad_acc, inner_state)`.
    Example:
        >>> opt = multi_steps(sgd(0.1), every_k=2)
    """
    if not isinstance(inner, Transform):
        raise TypeError(f"multi_steps: inner must be a Transform, got {type(inner).__name__}")
    if isinstance(every_k, bool) or not isinstance(every_k, int) or every_k < 1:
        raise ValueError(f"multi_steps: every_k must be an int >= 1, got {every_k!r}")

    def init(params):
        return MultiStepsState(0, tree_map(torch.zeros_like, params), inner.init(params))

    def update(grads, state, params=None, **extra):
        donate = donating(extra)
        g, spec = flatten(grads)
        acc = leaves_matching(state.grad_acc, spec, "multi_steps: the gradient accumulator")
        last = state.mini_step + 1 == every_k
        with grad_mode(extra):
            if not last:
                acc = foreach_op("add", acc, g, inplace=donate)
                # (differentiable: zeros on the tape, so the parameters stay on it too)
                own = owns_temporaries(extra)
                zero = zeros_like(g, inplace=donate) if own else foreach_op("mul", g, 0.0)
                new_state = MultiStepsState(
                    state.mini_step + 1, tree_unflatten(spec, acc), state.inner_state
                )
                return tree_unflatten(spec, zero), new_state
            # The mean goes into a buffer the inner optimizer may overwrite (the donated grads,
            # or a fresh list), never into the accumulator, which is reset here.
            mean = foreach_op("add", g, acc, inplace=donate)
            mean = foreach_op("div", mean, float(every_k), inplace=owns_temporaries(extra))
            acc = zeros_like(acc, inplace=donate)
        updates, inner_state = inner.update(
            tree_unflatten(spec, mean), state.inner_state, params, **extra
        )
        return updates, MultiStepsState(0, tree_unflatten(spec, acc), inner_state)

    return Transform(init, update)
