"""`masked`: apply a transform to some parameters only, and `no_decay_mask`, the usual mask.

By default masked-out parameters get a zero update and no state (freezing them, or giving a
parameter group its own optimizer). With `passthrough=True` they get their incoming updates
unchanged, which is how a transform is restricted inside a chain (e.g. weight decay on matrices
only).

Example:
    >>> # train only the head; the backbone gets zero updates and no Adam moments
    >>> opt = masked(adamw(1e-3), lambda params: {k: k.startswith("head.") for k in params})
    >>> # weight decay on weights but not on biases and norm scales
    >>> opt = chain(scale_by_adam(), masked(add_decayed_weights(0.01), no_decay_mask,
    ...             passthrough=True), scale_by_learning_rate(1e-3))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from ._foreach import differentiating, donating, foreach_op, zeros_like
from .base import Transform
from .spec import MaskedSpec

Mask = Mapping[str, bool] | Callable[[Any], Mapping[str, bool]]


class MaskedState(NamedTuple):
    """`inner_state`: the inner transform's state over the selected parameters only."""

    inner_state: Any


def no_decay_mask(params: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    """`{name: True}` for tensors of 2+ dims, False for biases and norm weights (ndim <= 1).

    Args:
        params: `{fqn: tensor}`.
    Returns:
        a mask for `masked`/`weight_decay_mask`: True means "apply weight decay".
    Example:
        >>> no_decay_mask({"fc.weight": torch.zeros(2, 3), "fc.bias": torch.zeros(2)})
        {'fc.weight': True, 'fc.bias': False}
    """
    _require_dict(params, "no_decay_mask")
    return {name: p.ndim > 1 for name, p in params.items()}


def masked(inner: Transform, mask: Mask, *, passthrough: bool = False) -> Transform:
    """Apply `inner` to the parameters where `mask` is True.

    Args:
        inner: the transform for the selected parameters; it sees only their sub-dict.
        mask: `{name: bool}` covering every parameter name (extra names are ignored), or a
            callable `params -> {name: bool}` (called on the params, or on the grads when
            `update` is given no params).
        passthrough: masked-out leaves keep their incoming updates (optax's `masked`) instead
            of getting a zero update.
    Returns:
        a `Transform` with `MaskedState(inner_state)`.
    Example:
        >>> frozen = masked(sgd(0.1), {"w": True, "b": False})  # "b" never moves
    """
    if not isinstance(inner, Transform):
        raise TypeError(f"masked: inner must be a Transform, got {type(inner).__name__}")
    if not (callable(mask) or isinstance(mask, Mapping)):
        raise TypeError(
            "masked: mask must be a {name: bool} dict or a callable params -> {name: bool}, "
            f"got {type(mask).__name__}"
        )

    def selected(names: Mapping[str, Any], source: Mapping[str, Any]) -> list[str]:
        """The names in `names` (in order) that the mask, built from `source`, selects."""
        values = mask(source) if callable(mask) else mask
        missing = [k for k in names if k not in values]
        if missing:
            raise ValueError(
                f"masked: the mask has no entry for {missing[:5]}; give a bool for every "
                "parameter name (or pass a callable such as no_decay_mask)"
            )
        return [k for k in names if bool(values[k])]

    def init(params):
        _require_dict(params, "masked")
        keep = selected(params, params)
        return MaskedState(inner.init({k: params[k] for k in keep}))

    def update(grads, state, params=None, **extra):
        _require_dict(grads, "masked")
        keep = selected(grads, params if isinstance(params, Mapping) else grads)
        sub_params = None if params is None else {k: params[k] for k in keep}
        sub_updates, inner_state = inner.update(
            {k: grads[k] for k in keep}, state.inner_state, sub_params, **extra
        )
        kept = set(keep)
        rest = [k for k in grads if k not in kept]
        if passthrough:
            rest_updates = [grads[k] for k in rest]
        else:
            rest_grads = [grads[k] for k in rest]
            if differentiating(extra):  # zeros on the tape, so the parameters stay on it too
                rest_updates = foreach_op("mul", rest_grads, 0.0)
            else:
                with torch.no_grad():
                    rest_updates = zeros_like(rest_grads, inplace=donating(extra))
        others = dict(zip(rest, rest_updates))
        updates = {k: sub_updates[k] if k in kept else others[k] for k in grads}
        return updates, MaskedState(inner_state)

    return Transform(init, update, MaskedSpec(inner.spec, mask, passthrough))


def masked_passthrough(transform: Transform, mask: Mask | None) -> Transform:
    """`transform` restricted to `mask` inside a chain (others pass through); as is if no mask.

    Used for the optimizers' `weight_decay_mask`: masked-out parameters still get the gradient
    step, only not the decay.
    """
    return transform if mask is None else masked(transform, mask, passthrough=True)


def _require_dict(tree: Any, who: str) -> None:
    if not isinstance(tree, Mapping):
        raise TypeError(
            f"{who} works on {{name: tensor}} dicts (state.params), got {type(tree).__name__}"
        )
