"""The optimizer contract: `Transform(init, update)`, `chain`, `identity`, `apply_updates`.

An optimizer is a pair of pure functions, exactly as in optax:

- `init(params) -> state`: the state for a pytree of parameters (`{fqn: tensor}`).
- `update(grads, state, params=None, **extra) -> (updates, state)`: turn gradients into updates.

Updates are *added* to the parameters by `apply_updates` (the learning rate is negated inside the
optimizer). `extra` carries optional context: `time` (a `functrain.units.Timestamp`, read by
schedules) and `donate=True` (the transform may overwrite `grads` and its own state tensors in
place, the fast path `fit` uses). Transforms ignore extras they do not know. Without `donate` an
update is pure: its inputs are never modified.

States are NamedTuples of tensors and plain Python numbers only, so every part of them checkpoints
by path (`opt_state.0.mu.fc.weight`).

Example:
    >>> opt = chain(clip_by_global_norm(1.0), adamw(lr=1e-3))
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> params = apply_updates(params, updates)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from ..tree import tree_flatten, tree_leaves, tree_unflatten
from ._foreach import foreach_op, is_dtensor
from .spec import ChainSpec

Params = Any
Updates = Any
OptState = Any


class Transform(NamedTuple):
    """A gradient transformation: `init(params) -> state`, `update(grads, state, params, **extra)`.

    Example:
        >>> t = scale(0.5)
        >>> updates, state = t.update({"w": torch.ones(2)}, t.init({"w": torch.zeros(2)}))
    """

    init: Callable[[Params], OptState]
    update: Callable[..., tuple[Updates, OptState]]
    # What this transform is, for the fused executor (`functrain.optim.fused`): a record from
    # `functrain.optim.spec` (e.g. `AdamSpec(...)`, `ChainSpec(...)`). None: only `update` runs
    # it (a user's own transform needs none).
    spec: Any = None


class EmptyState(NamedTuple):
    """The state of a transform that keeps none (it has no leaves, so nothing checkpoints)."""


def identity() -> Transform:
    """The transform that returns the gradients unchanged.

    Example:
        >>> updates, _ = identity().update(grads, EmptyState())
    """

    def init(params: Params) -> EmptyState:
        del params
        return EmptyState()

    def update(grads, state, params=None, **extra):
        del params, extra
        return grads, state

    return Transform(init, update)


def chain(*transforms: Transform) -> Transform:
    """Apply `transforms` one after the other; the state is the tuple of their states.

    Args:
        *transforms: `Transform`s, applied in order (the output of one feeds the next).
    Returns:
        a `Transform` whose state is `tuple(state_0, state_1, ...)`.
    Example:
        >>> opt = chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-3))
    """
    for i, t in enumerate(transforms):
        if not isinstance(t, Transform):
            raise TypeError(
                f"chain: argument {i} is {type(t).__name__}, not a Transform; pass "
                "functrain.optim transforms (e.g. chain(clip_by_global_norm(1.0), adamw()))"
            )

    def init(params: Params) -> tuple:
        return tuple(t.init(params) for t in transforms)

    def update(grads, state, params=None, **extra):
        if not isinstance(state, tuple) or len(state) != len(transforms):
            raise ValueError(
                f"chain of {len(transforms)} transforms got a state that is not a tuple of "
                f"{len(transforms)} inner states; build it with this chain's init(params)"
            )
        new_states = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params, **extra)
            new_states.append(s)
        return grads, tuple(new_states)

    return Transform(init, update, ChainSpec(tuple(t.spec for t in transforms)))


def differentiable(transform: Transform) -> Transform:
    """`transform` as an autograd op: its update runs out of place, recorded by autograd, so
    `torch.autograd.grad` flows through it (MAML, hypergradients, learned optimizers).

    The update never works in place (a `donate=True` extra is ignored) and has no fused form
    (torch's fused kernels are not autograd ops). With `apply_updates`, which is out of place
    and recorded whenever an update carries autograd history, k inner steps are differentiable
    end to end. The optimizers take `differentiable=True` for this. As in torch and optax, Adam's
    `sqrt(nu)` has no derivative where a gradient element is exactly 0 (a dead ReLU's weight):
    the hypergradient is NaN there.

    Args:
        transform: any `Transform` built from this package's transforms.
    Returns:
        a `Transform` with the same `init` and state.
    Example:
        >>> opt = differentiable(chain(clip_by_global_norm(1.0), adam(1e-2)))
        >>> g = torch.autograd.grad(loss(params), list(params.values()), create_graph=True)
        >>> updates, state = opt.update(dict(zip(params, g)), state, params)
        >>> new = apply_updates(params, updates)   # d new / d params is on the tape
    """
    if not isinstance(transform, Transform):
        raise TypeError(f"differentiable: expected a Transform, got {type(transform).__name__}")

    def update(grads, state, params=None, **extra):
        extra = {**extra, "donate": False, "differentiable": True}
        return transform.update(grads, state, params, **extra)

    return Transform(transform.init, update)


def maybe_differentiable(transform: Transform, flag: bool) -> Transform:
    """`differentiable(transform)` when `flag`, else `transform` (the optimizers' argument)."""
    return differentiable(transform) if flag else transform


def apply_updates(params: Params, updates: Updates, donate: bool = False) -> Params:
    """Add `updates` to `params`.

    Args:
        params: the parameters, a pytree (normally `{fqn: tensor}`).
        updates: the optimizer's output, same structure; for dicts it may also cover a subset of
            the names in `params` (the others, e.g. frozen parameters, are kept as they are).
        donate: add in place (one foreach kernel, under no_grad) and reuse the parameter
            tensors; otherwise new tensors are returned and `params` is left untouched.
    Returns:
        the new parameters, same structure as `params`. Updates are cast to each parameter's
        dtype; a new parameter requires grad exactly when the old one did. When grad mode is on
        and an update requires grad (a `differentiable` optimizer's), or a parameter is itself
        the result of recorded ops (a differentiable inner loop's), the addition is recorded
        too: the new parameters are functions of the old ones.
    Example:
        >>> params = apply_updates(params, updates)               # pure
        >>> params = apply_updates(params, updates, donate=True)  # in place
    """
    if (
        isinstance(params, Mapping)
        and isinstance(updates, Mapping)
        and all(isinstance(u, torch.Tensor) for u in updates.values())
    ):
        unknown = [k for k in updates if k not in params]
        if unknown:
            raise ValueError(
                f"apply_updates: updates name parameters that are not in params: {unknown[:5]}"
            )
        names = list(updates)
        new = _add([params[k] for k in names], [updates[k] for k in names], donate, names)
        out = dict(params)
        out.update(zip(names, new))
        return out
    p_leaves, p_spec = tree_flatten(params)
    u_leaves, u_spec = tree_flatten(updates)
    if p_spec != u_spec:
        raise ValueError(
            f"apply_updates: params and updates differ in structure: {p_spec} vs {u_spec}"
        )
    return tree_unflatten(p_spec, _add(p_leaves, u_leaves, donate, None))


def _add(ps: list, us: list, donate: bool, names: list | None) -> list:
    if len(ps) != len(us):
        where = f" (parameters {names[:5]}...)" if names else ""
        raise ValueError("apply_updates: each parameter needs exactly one update tensor" + where)
    # Casting follows optax: the parameter's dtype wins (e.g. fp32 updates on bf16 weights).
    us = [u if u.dtype == p.dtype else u.to(p.dtype) for p, u in zip(ps, us)]
    recorded = any(u.requires_grad for u in us) or any(p.grad_fn is not None for p in ps)
    if not donate and recorded and torch.is_grad_enabled():
        return foreach_op("add", ps, us)  # a differentiable update: on the tape
    with torch.no_grad():
        if donate:
            return foreach_op("add", ps, us, inplace=True)
        new = foreach_op("add", ps, us)
    for p, n in zip(ps, new):
        if p.requires_grad:
            n.requires_grad_(True)
    return new


def global_norm(tree: Any) -> torch.Tensor:
    """The L2 norm of all tensor leaves of `tree` together, as a 0-d tensor (no host sync).

    DTensor leaves contribute their true global norm: each rank sums the squares of its local
    piece, and the pieces are added up over the mesh dimensions the leaf is sharded on (one
    all-reduce per such dimension, for all leaves sharded alike). Replicated dimensions need no
    communication: every rank already holds the same values (so a DDP model's norm costs no
    collective). The result is the same on every rank and equal to the norm of the unsharded tree.
    Not differentiable (computed under no_grad).

    Args:
        tree: a pytree of tensors or DTensors (gradients, updates, parameters).
    Returns:
        a 0-d float32 tensor (float64 if any leaf is float64); zero for an empty tree.
    Example:
        >>> global_norm({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])})
        tensor(5.)
    """
    leaves = [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]
    if not leaves:
        return torch.zeros(())
    dtype = torch.float64 if any(x.dtype == torch.float64 for x in leaves) else torch.float32
    plain: list[torch.Tensor] = []
    # (mesh, the mesh dims to sum over) -> local pieces
    sharded: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = {}
    with torch.no_grad():
        for x in leaves:
            if not is_dtensor(x):
                plain.append(x)
            elif any(p.is_partial() for p in x.placements):
                # Unreduced values: reduce this one leaf to its full norm (rare, and correct).
                plain.append(torch.linalg.vector_norm(x.full_tensor()))
            else:
                mesh = x.device_mesh
                dims = tuple(
                    i for i, p in enumerate(x.placements) if p.is_shard() and mesh.size(i) > 1
                )
                sharded.setdefault((mesh, dims), []).append(x.to_local())
        device = leaves[0].to_local().device if is_dtensor(leaves[0]) else leaves[0].device
        total = _sum_of_squares(plain, dtype, device)
        for (mesh, dims), pieces in sharded.items():
            local = _sum_of_squares(pieces, dtype, device)
            for dim in dims:
                torch.distributed.all_reduce(local, group=mesh.get_group(dim))
            total = total + local
        return total.sqrt()


def _sum_of_squares(xs: list[torch.Tensor], dtype: torch.dtype, device: Any) -> torch.Tensor:
    if not xs:
        return torch.zeros((), dtype=dtype, device=device)
    norms = foreach_op("norm", xs)
    if any(n.dtype != dtype or n.device != device for n in norms):  # mixed: cast each first
        norms = [n.to(device=device, dtype=dtype) for n in norms]
    return torch.stack(norms).square().sum()
