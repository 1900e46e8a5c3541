"""An update the device may discard: selecting, after the fact, between the state before an
update and the state after it, by a 0-d boolean tensor (`skip`), without reading it on the host.

A guard (`make_step(skip_nonfinite=True)`, the fp16 loss scale) that decides on the device hands
its decision on as a tensor. The update then runs whatever the decision, and its result is kept
or discarded elementwise: `torch.where(skip, before, after)` selects exactly one of the two, so a
kept update is bit-identical to one that ran unguarded and a discarded one leaves every tensor as
it was. Where the update ran in place, the tensors it overwrites are copied first
(`snapshot`); torch's fused Adam and SGD kernels instead take the decision as their `found_inf`
and write nothing at all (`functrain.optim.kernels`).

The optimizer state's Python numbers have no device to decide on. Its update counts (Adam's bias
correction reads them) are kept as 0-d int64 tensors (`counts_on_device`) and selected like the
tensors; its floats (the lr last used, a decoupled decay's factor) take the update's value, skip
or not: the next update evaluates them again from the time, so nothing computed depends on them.

Example:
    >>> saved = snapshot([params, state])
    >>> params, state = update(...)                       # in place
    >>> params, state = keep_where(skip, (old_params, old_state), (params, state), saved)
"""

from __future__ import annotations

from typing import Any

import torch

from ..tree import tree_flatten, tree_unflatten
from ._foreach import is_dtensor, local_pieces

__all__ = ["counts_on_device", "found_inf", "keep_where", "local", "snapshot"]


def local(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's local piece (the selection is elementwise), a plain tensor as it is."""
    return local_pieces([x])[0] if is_dtensor(x) else x


def found_inf(skip: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`skip` as the float32 flag torch's fused kernels read (1.0: write nothing)."""
    return skip.to(device=device, dtype=torch.float32)


def snapshot(tree: Any, *, pieces: bool = True) -> list[torch.Tensor | None]:
    """Copies of `tree`'s tensor leaves (None for other leaves), in leaf order: of their local
    pieces (for `keep_where(inplace=True)`), or whole (`pieces=False`, for `inplace=False`)."""
    leaves = tree_flatten(tree)[0]
    take = local if pieces else (lambda x: x)
    return [take(x).clone() if isinstance(x, torch.Tensor) else None for x in leaves]


def keep_where(
    skip: torch.Tensor,
    before: Any,
    after: Any,
    saved: list[torch.Tensor | None] | None = None,
    *,
    inplace: bool = True,
) -> Any:
    """`after`, with each leaf holding `before`'s value where `skip` is True (no host read).

    Args:
        skip: 0-d bool tensor.
        before: the tree as it was before the update (its Python numbers still the old ones).
        after: the tree the update returned, of the same structure.
        saved: `snapshot(before)` when the update overwrote `before`'s tensors in place; None
            when it did not (or wrote nothing on a skip: a same tensor is then left alone).
        inplace: write the selection into `after`'s tensors (False: new tensors, for a traced
            or vmapped update).
    Returns:
        `after`'s structure: its tensors holding the selection, its counts as 0-d int64
        tensors holding the selection, its other numbers `after`'s.
    """
    old, _ = tree_flatten(before)
    new, spec = tree_flatten(after)
    if len(old) != len(new):
        raise ValueError(
            f"an update changed its state's structure ({len(old)} leaves before, {len(new)} "
            "after): a skipped step cannot put it back; a transform's update must return the "
            "structure its init made"
        )
    out = []
    for i, (b, a) in enumerate(zip(old, new)):
        kept = saved[i] if saved is not None else None
        if isinstance(a, torch.Tensor):
            if kept is None and a is b:
                out.append(a)  # written nothing on a skip (a kernel's found_inf), or unchanged
                continue
            if not inplace:
                out.append(torch.where(skip, kept if kept is not None else b, a))
                continue
            source = local(kept if kept is not None else b)
            target = local(a)
            torch.where(skip.to(target.device), source, target, out=target)
            out.append(a)
        elif _is_count(a) and (isinstance(b, torch.Tensor) or a != b):
            b_t, a_t = (torch.as_tensor(v, dtype=torch.int64, device=skip.device) for v in (b, a))
            out.append(torch.where(skip, b_t, a_t))
        else:
            out.append(a)  # the lr last used, a decay's factor: recomputed from the time
    return tree_unflatten(spec, out)


def _is_count(value: Any) -> bool:
    """An update count: a Python int, or the 0-d integer tensor a device decision made of one."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool
    return isinstance(value, int) and not isinstance(value, bool)


def counts_on_device(tree: Any, device: torch.device | str) -> Any:
    """`tree` with its update counts (Python ints) as 0-d int64 tensors on `device`; the same
    object when it has none. A step that decides skips on the device keeps its optimizer's
    counts so from the start, so that its checkpoints (and the state a resume restores into)
    have one structure whatever it decided.

    Example:
        >>> counts_on_device((0, 0.1), "cpu")
        (tensor(0), 0.1)
    """
    leaves, spec = tree_flatten(tree)
    if not any(_is_count(x) and not isinstance(x, torch.Tensor) for x in leaves):
        return tree
    return tree_unflatten(
        spec,
        [
            torch.tensor(x, dtype=torch.int64, device=device)
            if _is_count(x) and not isinstance(x, torch.Tensor)
            else x
            for x in leaves
        ],
    )
