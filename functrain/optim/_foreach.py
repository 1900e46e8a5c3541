"""Private helpers: torch's foreach kernels on lists of tensors, pure or in place; reading a
hyperparameter's current value; validating hyperparameters; tree plumbing.

Every transform flattens its pytrees into lists and runs one foreach kernel (`_foreach_<op>`,
through `functrain._torch`) per operation. `foreach_op(op, xs, ..., inplace=...)` picks the
out-of-place or in-place variant, so the pure path and the donating path share one code path: a
transform allocates fresh tensors once (or writes into donated ones) and then works in place on
what it owns.

Example:
    >>> xs = [torch.ones(2), torch.ones(3)]
    >>> foreach_op("mul", xs, 2.0)[0]
    tensor([2., 2.])
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import _torch
from .._lazy import is_dtensor as is_dtensor  # re-exported: the optimizers test with it
from ..tree import tree_flatten


def placed_alike(a: Any, b: Any) -> bool:
    """True when `a` and `b` are DTensors with the same placements on the same mesh, so an
    elementwise op on their local pieces is the op on the whole tensors."""
    return (
        is_dtensor(a)
        and is_dtensor(b)
        and a.placements == b.placements
        and a.device_mesh == b.device_mesh
    )


def local_pieces(xs: list[Any]) -> list[torch.Tensor]:
    """Each DTensor's local tensor (sharing its storage), plain tensors as they are."""
    return [_torch.local_tensor(x) if is_dtensor(x) else x for x in xs]


def foreach_op(
    op: str, xs: list[torch.Tensor], *args: Any, inplace: bool = False, **kwargs: Any
) -> list:
    """Apply torch's foreach kernel `_foreach_<op>` (`_foreach_<op>_` when `inplace`) to `xs`.

    Args:
        op: the foreach op name without prefix, e.g. "mul", "add", "lerp".
        xs: the tensors (written to when `inplace`).
        *args, **kwargs: the op's other arguments (scalars or lists matching `xs`).
        inplace: write into `xs` and return it, instead of returning new tensors.
    Returns:
        the result tensors, as a list (`xs` itself when `inplace`).
    """
    if not xs:  # foreach kernels reject empty lists
        return xs if inplace else []
    if _torch.functorch_transforms_active():
        # vmap has no batching rule for the foreach kernels, nor for some in-place ops: one
        # out-of-place op per tensor there (every caller uses the returned list).
        return _per_tensor(op, xs, args, kwargs)
    if is_dtensor(xs[0]) and op not in _REDUCTIONS:
        local = _on_local_pieces(op, xs, args, kwargs, inplace)
        if local is not None:
            return local
    if inplace:
        _torch.foreach(op, inplace=True)(xs, *args, **kwargs)
        return xs
    return list(_torch.foreach(op)(xs, *args, **kwargs))


_REDUCTIONS = frozenset({"norm", "max"})  # not elementwise: a shard's answer is not the whole's


def _on_local_pieces(op: str, xs: list, args: tuple, kwargs: dict, inplace: bool) -> list | None:
    """The elementwise op on each DTensor's local piece, or None when the pieces do not line up.

    Why: DTensor dispatches a foreach op tensor by tensor, with a sharding decision each, which
    made the optimizer dominate a DDP step. When every tensor argument is a DTensor placed like
    the corresponding `xs[i]`, the op is the same on each rank's pieces.
    """
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, (list, tuple)):
            if len(arg) != len(xs) or not all(placed_alike(o, x) for o, x in zip(arg, xs)):
                return None
        elif isinstance(arg, torch.Tensor) and (arg.dim() > 0 or is_dtensor(arg)):
            return None  # only plain scalar tensors broadcast the same on every piece

    def unwrap(a):
        return local_pieces(a) if isinstance(a, (list, tuple)) else a

    pieces = local_pieces(xs)
    args = tuple(unwrap(a) for a in args)
    kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    if inplace:
        _torch.foreach(op, inplace=True)(pieces, *args, **kwargs)
        return xs
    outs = _torch.foreach(op)(pieces, *args, **kwargs)
    from ..parallel.offload import dtensor_like  # keeps a host piece (offload) on the host

    return [dtensor_like(o, x) for o, x in zip(outs, xs)]


def _per_tensor(op: str, xs: list, args: tuple, kwargs: dict) -> list:
    """The foreach op `op` as one out-of-place torch op per tensor (same values; works under
    `torch.func` transforms). A list argument gives each tensor its own element, anything else
    is shared.
    """

    def pick(arg: Any, i: int) -> Any:
        return arg[i] if isinstance(arg, (list, tuple)) else arg

    out = []
    for i, x in enumerate(xs):
        each = [pick(a, i) for a in args]
        named = {k: pick(v, i) for k, v in kwargs.items()}
        if op == "norm":
            out.append(torch.linalg.vector_norm(x, *each, **named))
        elif op == "zero":
            out.append(torch.zeros_like(x))
        else:
            out.append(getattr(torch, op)(x, *each, **named))
    return out


def copy_into(dst: list[torch.Tensor], src: list[torch.Tensor]) -> list[torch.Tensor]:
    """`dst[i].copy_(src[i])` for all i; returns `dst` (under `torch.func` transforms, copies
    of `src` instead: use the returned list)."""
    if not dst:
        return dst
    if _torch.functorch_transforms_active():  # vmap: no batching rule for in-place copies
        return [s.clone() for s in src]
    if is_dtensor(dst[0]):
        # DTensor has no sharding rule for _foreach_copy_ (torch 2.13); copy one by one.
        for d, s in zip(dst, src):
            d.copy_(s)
    else:
        _torch.foreach_copy_(dst, src)
    return dst


def zeros_like(xs: list[torch.Tensor], *, inplace: bool = False) -> list[torch.Tensor]:
    """Zeros shaped (and placed) like `xs`; overwrite `xs` when `inplace`."""
    if inplace:
        return foreach_op("zero", xs, inplace=True)
    return [torch.zeros_like(x) for x in xs]


def donating(extra: Mapping[str, Any]) -> bool:
    """True when the caller lets transforms overwrite grads and their own state (`donate=True`);
    never for a differentiable update, whose inputs autograd may still need."""
    return bool(extra.get("donate", False)) and not differentiating(extra)


def differentiating(extra: Mapping[str, Any]) -> bool:
    """True for a differentiable update (`functrain.optim.differentiable`): every op out of
    place and recorded by autograd, so gradients flow through the update."""
    return bool(extra.get("differentiable", False))


def owns_temporaries(extra: Mapping[str, Any]) -> bool:
    """True when a transform may work in place on the fresh tensors it made itself: always,
    except in a differentiable update (autograd may need a temporary's value for the backward)."""
    return not differentiating(extra)


def grad_mode(extra: Mapping[str, Any]) -> Any:
    """The autograd mode an update runs its math in: no_grad, or, for a differentiable update,
    the caller's own mode."""
    return contextlib.nullcontext() if differentiating(extra) else torch.no_grad()


def update_math(update: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a transform's `update`: its math runs under `grad_mode(extra)`."""

    @functools.wraps(update)
    def run(grads: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        with grad_mode(extra):
            return update(grads, state, params, **extra)

    return run


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """`(leaves, treespec)` of a gradient-like pytree."""
    return tree_flatten(tree)


def leaves_matching(tree: Any, treespec: Any, what: str) -> list[Any]:
    """The leaves of `tree`, which must have the structure `treespec` (that of the gradients).

    Raises:
        ValueError: naming `what` when the structures differ.
    """
    leaves, spec = tree_flatten(tree)
    if spec != treespec:
        raise ValueError(
            f"{what} do not have the same structure as the gradients: {spec} vs {treespec}. "
            "Pass params and grads over the same parameter names (the trainable ones), and "
            "build the optimizer state with `init` on those same params."
        )
    return leaves


def params_like(grads: Any, params: Any, treespec: Any, who: str) -> list[torch.Tensor]:
    """The parameter leaves that correspond to the gradient leaves, in the same order.

    `params` may be a superset dict of `grads` (e.g. all of `state.params` including frozen ones):
    the names of `grads` are picked from it.

    Raises:
        ValueError: when `params` is None (the transform `who` needs them) or does not match.
    """
    if params is None:
        raise ValueError(f"{who} needs the current parameters: call update(grads, state, params).")
    if isinstance(grads, Mapping) and isinstance(params, Mapping) and params.keys() != grads.keys():
        missing = [k for k in grads if k not in params]
        if missing:
            raise ValueError(
                f"{who}: params lack the gradient entries {missing[:5]}; pass the params the "
                "gradients were taken with respect to."
            )
        params = {k: params[k] for k in grads}
    return leaves_matching(params, treespec, f"{who}: params")


def hyperparam_value(
    value: float | Callable[[Any], float],
    count: int,
    extra: Mapping[str, Any],
    name: str = "hyperparameter",
) -> float:
    """A hyperparameter's current value: a number as is, a schedule at `extra["time"]` or `count`.

    Args:
        value: a number, or a schedule `schedule(t) -> float`.
        count: the transform's own update count, used when no `time` extra is given.
        extra: the update's keyword extras (may hold `time`, a `functrain.units.Timestamp`).
        name: what the value is, for the error.
    Returns:
        the value as a Python float.
    Raises:
        ValueError: a schedule gave NaN or an infinity (it would silently ruin the run).
    """
    if not callable(value):
        return float(value)
    t = extra.get("time")
    result = float(value(count if t is None else t))
    if not math.isfinite(result):
        where = f"batch {t.batch}" if t is not None else f"update {count}"
        raise ValueError(
            f"the schedule of {name} gave {result} at {where}: a schedule must return finite "
            f"numbers (check its formula and its times, e.g. a zero-length warm-up); {value!r}"
        )
    return result


def start_value(value: float | Callable[[Any], float]) -> float:
    """A hyperparameter's value at time 0, for an optimizer's `init`.

    A schedule in epoch or duration units cannot resolve without the run's horizon, which `init`
    does not know yet; at time 0 its value does not depend on the horizon, so it is evaluated on
    a placeholder one.
    """
    if not callable(value):
        return float(value)
    try:
        return float(value(0))  # plain callables of the step count, and batch-unit schedules
    except ValueError:  # a horizon is needed: functrain schedules in epoch or duration units
        from ..units import Timestamp

        return float(value(Timestamp(batches_per_epoch=1, max_batches=1)))


def check_number(
    name: str,
    value: Any,
    *,
    low: float = 0.0,
    high: float | None = None,
    schedule: bool = False,
) -> None:
    """Validate a hyperparameter: a number in `[low, high)`, or a schedule if `schedule` is True.

    Raises:
        TypeError: when `value` is neither a number nor (where allowed) a schedule.
        ValueError: when `value` is a number outside `[low, high)`.
    """
    if schedule and callable(value):
        return  # schedules are checked when evaluated
    kinds = "a number or a schedule `t -> float`" if schedule else "a number"
    try:
        if isinstance(value, (bool, str)):  # float(True) and float("0.1") would pass
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        hint = "" if schedule else " (schedule it with functrain.optim.inject_hyperparams)"
        raise TypeError(f"{name} must be {kinds}{hint}, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(
            f"invalid {name}={value}: it must be a finite number (NaN or an infinity would turn "
            "every parameter into NaN at the first step)"
        )
    if number < low or (high is not None and number >= high):
        bounds = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"invalid {name}={value}: it must be {bounds}")
