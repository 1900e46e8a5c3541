"""Ensembles in one step: stack N train states into one, vmap the step over it, split it again.

A `TrainState` is a pytree for `torch.func` too: its tensors (params, buffers, optimizer moments,
algorithm state) are the children, and its Python numbers (the step, the rng, the timestamp, the
optimizer's counts and learning rate) are static, non-vmapped context, like the layout. So a step
from `functrain.make_step` maps over a stacked state as it is:

    stacked = functrain.stack_states([state_0, ..., state_7])
    stacked, metrics = torch.func.vmap(step, in_dims=(0, None))(stacked, batch)
    members = functrain.unstack_states(stacked)

Under a `torch.func` transform the step picks its functorch form by itself (gradients by
`torch.func.grad`, no donation, the optimizer's functional update one op per tensor, metrics as
tensors); the same step object runs eagerly and vmapped. Members share what is static: they take
their steps together, on batches of one size, under one seed (`state.rng`); they differ in every
tensor (their initialisations, their moments). A batch with its own leading member axis gives
each member its own data: `in_dims=(0, 0)`.

Example:
    >>> states = [functrain.init(make_model(seed), opt, seed=0) for seed in range(8)]
    >>> stacked = stack_states(states)
    >>> stacked, metrics = torch.func.vmap(step, in_dims=(0, None))(stacked, batch)
    >>> len(unstack_states(stacked))
    8
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .state import TrainState
from .tree import leaves_with_paths, tree_flatten, tree_unflatten

__all__ = ["stack_states", "unstack_states"]


def stack_states(states: Sequence[TrainState]) -> TrainState:
    """One state whose every tensor has a leading member axis: `states[i]` at index `i`.

    Args:
        states: train states of one structure (same model shapes, optimizer and algorithms),
            with equal Python-number leaves (step, rng, timestamp, optimizer counts) and no
            layout (one process, no sharding).
    Returns:
        the stacked `TrainState`; its tensors are new (the members' are not modified).
    Raises:
        ValueError: no states, or states that differ in structure, in a number, in a tensor's
            shape or dtype, or that are sharded; the message names the first differing path.
    Example:
        >>> stacked = stack_states([state_a, state_b])
        >>> stacked.params["weight"].shape[0]
        2
    """
    states = list(states)
    if not states:
        raise ValueError("stack_states needs at least one TrainState, got an empty sequence")
    for i, state in enumerate(states):
        if not isinstance(state, TrainState):
            raise TypeError(f"stack_states takes TrainStates; member {i} is {type(state).__name__}")
        if state.layout is not None:
            raise ValueError(
                f"stack_states: member {i} is sharded (its layout is set); stack states of one "
                "process (functrain.init without a mesh or plan)"
            )
    first_leaves, spec = tree_flatten(states[0])
    paths = [path for path, _ in leaves_with_paths(states[0])]
    columns: list[list] = [[x] for x in first_leaves]
    for i, state in enumerate(states[1:], start=1):
        leaves, other = tree_flatten(state)
        if other != spec:
            raise ValueError(
                f"stack_states: member {i} has another structure than member 0 "
                f"({_first_difference(states[0], state)}); members must come from the same "
                "model architecture, optimizer and algorithms"
            )
        for column, path, x in zip(columns, paths, leaves):
            _check_member(column[0], x, path, i)
            column.append(x)
    stacked = [
        torch.stack(column) if isinstance(column[0], torch.Tensor) else column[0]
        for column in columns
    ]
    return tree_unflatten(spec, stacked)


def unstack_states(state: TrainState) -> list[TrainState]:
    """The members of a stacked state, as separate states (the inverse of `stack_states`).

    Args:
        state: a state whose every tensor has the same leading member axis.
    Returns:
        one `TrainState` per member; their tensors are copies, so a member trained further
        (donated or not) never writes into `state`.
    Raises:
        ValueError: `state` has no tensor, or its tensors disagree on the member axis.
    Example:
        >>> members = unstack_states(stack_states([state_a, state_b]))
        >>> len(members)
        2
    """
    if not isinstance(state, TrainState):
        raise TypeError(f"unstack_states takes a TrainState, got {type(state).__name__}")
    leaves, spec = tree_flatten(state)
    tensors = [(p, x) for p, x in leaves_with_paths(state) if isinstance(x, torch.Tensor)]
    if not tensors:
        raise ValueError("unstack_states: the state has no tensor to split")
    first_path, first = tensors[0]
    members = first.shape[0] if first.dim() else 0
    for path, x in tensors:
        if not x.dim() or x.shape[0] != members or not members:
            found = f"{x.shape[0]} members" if x.dim() else "no member axis (0-d)"
            raise ValueError(
                f"unstack_states: {path!r} has {found} but {first_path!r} has {members}; unstack "
                "a state made by stack_states (or returned by torch.func.vmap with out_dims=0)"
            )
    return [
        tree_unflatten(spec, [x[i].clone() if isinstance(x, torch.Tensor) else x for x in leaves])
        for i in range(members)
    ]


def _check_member(first, x, path: str, index: int) -> None:
    """Raise when member `index`'s leaf at `path` cannot stack with member 0's."""
    if isinstance(first, torch.Tensor) != isinstance(x, torch.Tensor):
        raise ValueError(
            f"stack_states: {path!r} is a tensor in one member and a "
            f"{type(x if isinstance(first, torch.Tensor) else first).__name__} in the other "
            f"(members 0 and {index})"
        )
    if isinstance(x, torch.Tensor):
        if x.shape != first.shape or x.dtype != first.dtype or x.device != first.device:
            raise ValueError(
                f"stack_states: {path!r} is {tuple(first.shape)} {first.dtype} on {first.device} "
                f"in member 0 but {tuple(x.shape)} {x.dtype} on {x.device} in member {index}"
            )
    elif x != first:
        raise ValueError(
            f"stack_states: {path!r} is {first!r} in member 0 but {x!r} in member {index}; "
            "Python numbers are shared by all members (static under vmap): stack states at "
            "the same step, with the same seed and optimizer settings"
        )


def _first_difference(a: TrainState, b: TrainState) -> str:
    """A short description of where two states' structures first differ."""
    pa = [p for p, _ in leaves_with_paths(a)]
    pb = [p for p, _ in leaves_with_paths(b)]
    sa, sb = set(pa), set(pb)
    only_a = [p for p in pa if p not in sb]
    only_b = [p for p in pb if p not in sa]
    if only_a or only_b:
        return f"only in member 0: {only_a[:3]}, only in the other: {only_b[:3]}"
    return "same leaf paths, different containers or static fields"
