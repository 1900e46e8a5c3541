"""The fused executor's cache: the grouping it decided for a set of tensors, kept between calls.

`functrain.optim.fused` groups a composition's parameters into kernel calls (by decay, device
and dtype, and a decay mask's selection). That depends on the tensors, not on their values, so a
donating step, which updates the same tensors in place every call, decides it once per set.
A performance cache, kept by the step (no process-wide state); see `FusedCache`.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Mapping

__all__ = ["FusedCache"]


class FusedCache:
    """What `fused_update` decided about a set of tensors, kept for the next calls on them.

    The grouping of parameters into kernel calls (and a decay mask's selection) depends on the
    parameters and moments, not on their values, so a step that updates the same tensors in
    place every call (a donating step) decides it once. An entry is found by the identity of
    those tensors through weak references: it keeps nothing alive, and a tensor that died
    cannot be mistaken for a new one. A performance cache: results never depend on it.

    Not for a pure step's private buffers: `functrain.optim.buffers` recycles a buffer only
    when nothing, a weak reference included, refers to it.

    Example:
        >>> cache = FusedCache()
        >>> state = fused_update(opt, grads, state, params, cache=cache)   # decides, stores
        >>> state = fused_update(opt, grads, state, params, cache=cache)   # reuses
    """

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (names, decision, weak references, layout)

    def lookup(
        self, params: Mapping, moments: list, names: list[str], decision: tuple
    ) -> list | None:
        """The stored layout for exactly these tensors, names and `(decays, mask)`, or None."""
        entry = self._entry
        if entry is None:
            return None
        known_names, (decays, mask), refs, layout = entry
        if known_names != tuple(names) or decays != decision[0] or mask is not decision[1]:
            return None
        tensors = _tensors(params, moments, names)
        # identity of every tensor, in C (no Python frame per tensor: this runs on every step)
        if len(refs) != len(tensors) or not all(map(operator.is_, map(_deref, refs), tensors)):
            return None
        return layout

    def store(
        self, params: Mapping, moments: list, names: list[str], decision: tuple, layout: list
    ) -> None:
        """Remember `layout` for these tensors (in place of what was stored)."""
        refs = [weakref.ref(t) for t in _tensors(params, moments, names)]
        self._entry = (tuple(names), decision, refs, layout)

    def clear(self) -> None:
        """Forget what is stored."""
        self._entry = None


_deref = weakref.ref.__call__  # `ref -> referent or None`, a C method


def _tensors(params: Mapping, moments: list, names: list[str]) -> list:
    tensors = list(map(params.__getitem__, names))  # in C: this runs on every step
    for tree in moments:
        tensors += map(tree.__getitem__, names)
    return tensors
