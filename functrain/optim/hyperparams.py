"""`inject_hyperparams`: hyperparameters as state, and `current_lr`, which reads the lr back.

`inject_hyperparams(factory)(lr=schedule, weight_decay=0.05)` evaluates every numeric or
scheduled hyperparameter at each update, stores the values in the state as Python floats (so they
checkpoint and can be logged), and rebuilds `factory(**values)` to do the update. A schedule is a
callable `schedule(t) -> float`; `t` is `extra["time"]` (a `functrain.units.Timestamp`) when the
update gets one, else the transform's own update count.

Example:
    >>> opt = inject_hyperparams(adamw)(lr=lambda t: 1e-3 * min(1.0, (t + 1) / 100))
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params, time=Timestamp(batch=0))
    >>> current_lr(state)  # the value used at batch 0
    1e-05
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ..tree import tree_flatten
from ._foreach import hyperparam_value, start_value
from .base import Transform
from .spec import InjectSpec

LR_NAMES = ("lr", "learning_rate")


class InjectHyperparamsState(NamedTuple):
    """`count`: updates done (int); `hyperparams`: `{name: float}` last used; `inner_state`."""

    count: int  # type: ignore[assignment]  # optax's field name (checkpoint key), not tuple.count
    hyperparams: dict[str, float]
    inner_state: Any


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (bool, str))


def inject_hyperparams(
    factory: Callable[..., Transform], static_args: Sequence[str] = ()
) -> Callable[..., Transform]:
    """Wrap an optimizer factory so that its numeric hyperparameters live in the state.

    Args:
        factory: a function returning a `Transform` (e.g. `adamw`, `sgd`, `clip_by_global_norm`).
        static_args: names passed to `factory` as given, even if numeric (e.g. "every_k").
            Non-numeric arguments (bools, tuples such as `betas`, masks) are always static; a
            callable is a schedule except for a mask (`weight_decay_mask`) or an argument
            whose default is not a number.
    Returns:
        a function taking `factory`'s keyword arguments, where numbers may be replaced by
        schedules, and returning a `Transform` with `InjectHyperparamsState`.
    Raises:
        ValueError: at update time, if a changing value alters the state's structure (e.g.
            sgd's momentum going from 0 to nonzero); start it nonzero or keep it static.
    Example:
        >>> opt = inject_hyperparams(sgd)(lr=cosine, momentum=0.9)
    """
    static_names = frozenset(static_args)

    def make(**hparams: Any) -> Transform:
        given = hparams
        hparams = _with_initial_lr(factory, hparams)
        fixed = static_names | (hparams.keys() - given.keys())  # a derived initial_lr is static
        dynamic = {
            k: v
            for k, v in hparams.items()
            if k not in fixed and (_is_number(v) or (callable(v) and _numeric_arg(factory, k)))
        }
        static = {k: v for k, v in hparams.items() if k not in dynamic}

        def values_at(count: int, extra: Mapping[str, Any]) -> dict[str, float]:
            return {k: hyperparam_value(v, count, extra, k) for k, v in dynamic.items()}

        def init(params):
            values = {k: start_value(v) for k, v in dynamic.items()}
            return InjectHyperparamsState(0, values, factory(**static, **values).init(params))

        def structure_error(values):
            return ValueError(
                f"inject_hyperparams({getattr(factory, '__name__', factory)}): the values "
                f"{values} change the optimizer state's structure (e.g. a momentum that "
                "becomes nonzero); make that hyperparameter start nonzero or pass it as a "
                "static_args name"
            )

        def update(grads, state, params=None, **extra):
            values = values_at(state.count, extra)
            inner = factory(**static, **values)
            try:
                updates, inner_state = inner.update(grads, state.inner_state, params, **extra)
            except (ValueError, TypeError, AttributeError) as err:
                changed = params is not None and (
                    tree_flatten(inner.init(params))[1] != tree_flatten(state.inner_state)[1]
                )
                if changed:
                    raise structure_error(values) from err
                raise
            if tree_flatten(inner_state)[1] != tree_flatten(state.inner_state)[1]:
                raise structure_error(values)
            return updates, InjectHyperparamsState(state.count + 1, values, inner_state)

        def build(values):
            return factory(**static, **values)

        return Transform(init, update, InjectSpec(values_at, build))

    return make


def _with_initial_lr(factory: Callable[..., Transform], hparams: dict) -> dict:
    """`hparams`, with `initial_lr` read from a scheduled `lr` for the decoupled optimizers.

    The factory sees each step's lr as a number, so without this it would take every step's
    lr for the base and never follow the schedule's shape.
    """
    lr = hparams.get("lr")
    if "initial_lr" in hparams or not callable(lr) or not _accepts(factory, "initial_lr"):
        return hparams
    from .scale import base_lr

    base = base_lr(lr)
    if base is None:
        raise ValueError(
            f"inject_hyperparams({getattr(factory, '__name__', factory)}): the decay is relative "
            "to the base learning rate, which a plain function does not name; pass initial_lr= "
            "(static), or write lr as `base * schedule` with a functrain.schedules schedule"
        )
    return {**hparams, "initial_lr": base}


def _numeric_arg(factory: Callable[..., Any], name: str) -> bool:
    """True when a callable given for `factory`'s argument `name` is a schedule: unless the
    argument is a mask (`mask`, `*_mask`) or has a default that is not a number (a function
    argument), a callable there stands for a number that changes."""
    if name in LR_NAMES:
        return True
    if name == "mask" or name.endswith("_mask"):
        return False
    try:
        default = inspect.signature(factory).parameters[name].default
    except (KeyError, TypeError, ValueError):
        return True
    return default is inspect.Parameter.empty or _is_number(default)


def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or an odd callable: nothing to add
        return False


def current_lr(opt_state: Any) -> float | None:
    """The learning rate last used, found by walking the optimizer state; None if there is none.

    Looks (outermost first) for an `InjectHyperparamsState`-like `hyperparams` dict with an
    "lr"/"learning_rate" entry, or a state NamedTuple with a numeric `lr` field (such as
    `ScaleByLearningRateState`). Only NamedTuple fields are matched, never parameter names.

    Example:
        >>> current_lr(sgd(0.1).init(params))
        0.1
    """
    if isinstance(opt_state, tuple) and hasattr(opt_state, "_fields"):
        fields = opt_state._fields
        hyperparams = getattr(opt_state, "hyperparams", None) if "hyperparams" in fields else None
        if isinstance(hyperparams, Mapping):
            for name in LR_NAMES:
                if name in hyperparams:
                    return float(hyperparams[name])
        for name in LR_NAMES:
            if name in fields and _is_number(getattr(opt_state, name)):
                return float(getattr(opt_state, name))
    children: Iterable[Any]
    if isinstance(opt_state, (tuple, list)):
        children = opt_state
    elif isinstance(opt_state, Mapping):
        children = opt_state.values()
    else:
        return None
    for child in children:
        if isinstance(child, torch.Tensor):  # a moment or parameter, not a state to search
            continue
        found = current_lr(child)
        if found is not None:
            return found
    return None
