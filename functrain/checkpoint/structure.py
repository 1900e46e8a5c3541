"""A pytree's structure as a save sees it: its leaves' paths, their key types, its empty nodes.

Read off the treedef alone (no leaf is looked at), so a run that saves one structure over and
over walks it once: `of_treedef` is memoized by the treedef. Paths are the strings tree.json and
orbax's `_METADATA` name leaves by; empty containers (`{}`, `()`, `None`) hold no leaf but orbax
lists them, so a chain with a stateless transform in the middle can be rebuilt.

Example:
    >>> leaves, paths, key_types, treedef = leaf_paths({"w": w, "opt": ({}, mu)})
    >>> paths
    [('opt', '1'), ('w',)]
    >>> empty_nodes({"w": w, "opt": ({}, mu)})
    [(('opt', '0'), (2, 1), 'Dict')]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import optree

from ..tree import NAMESPACE, key_to_str
from . import layout


@dataclasses.dataclass(frozen=True)
class Structure:
    """What a save needs of a pytree's structure, independent of its leaves' values.

    Attributes:
        paths: every leaf's path as strings, in flatten order.
        key_types: orbax's key type per path entry (`layout.KEY_SEQUENCE`/`KEY_MAPPING`).
        empty_nodes: `(path, key_types, kind)` of the empty containers (see `empty_nodes`).
        exact: every path entry is a string key or a position, so any treedef equal to this
            one names its leaves alike (see `of_treedef`).
    """

    paths: tuple[tuple[str, ...], ...]
    key_types: tuple[tuple[int, ...], ...]
    empty_nodes: tuple[tuple[tuple[str, ...], tuple[int, ...], str], ...]
    exact: bool = True


def of_treedef(treedef: Any) -> tuple[Structure, str]:
    """The `Structure` of the pytrees of `treedef`, and its text (`str(treedef)`, tree.json's
    informational `treedef`).

    Treedefs compare dict keys by value: `{1: x}` equals `{True: x}` but names its leaf "True".
    So the memo by treedef alone holds only exact structures (string keys and positions, which
    an equal treedef shares); any other is looked up by its text too. That spares a save of a
    known structure its text (~70 us for a TrainState), which for an exact one is the text of
    the first equal treedef: the same but for the repr of custom nodes' static metadata.

    Example:
        >>> found, text = of_treedef(optree.tree_structure({"a": 1}, namespace=NAMESPACE))
        >>> found.paths, found.exact
        ((('a',),), True)
    """
    try:
        known = _exact(treedef)
        if known is not None:
            return known
        text = str(treedef)
        return _memoized(treedef, text), text
    except TypeError:  # a custom node whose metadata is not hashable: nothing to key a memo by
        return _walk(treedef), str(treedef)


@functools.lru_cache(maxsize=16)
def _exact(treedef: Any) -> tuple[Structure, str] | None:
    found = _walk(treedef)
    return (found, str(treedef)) if found.exact else None


@functools.lru_cache(maxsize=16)
def _memoized(treedef: Any, text: str) -> Structure:
    return _walk(treedef)


def _walk(treedef: Any) -> Structure:
    paths, key_types, empty = [], [], []
    exact = True
    # (spec, entries on the way to it), depth first in flatten order
    stack: list[tuple[Any, tuple]] = [(treedef, ())]
    while stack:
        spec, entries = stack.pop()
        if spec.is_leaf():
            paths.append(tuple(key_to_str(e) for e in entries))
            key_types.append(tuple(_key_type(e) for e in entries))
            continue
        if spec.num_children == 0:
            if entries:  # (an empty root is no entry of anything)
                path = tuple(key_to_str(e) for e in entries)
                empty.append((path, tuple(_key_type(e) for e in entries), _empty_kind(spec)))
            continue
        children = spec.children()
        accessors = spec.one_level().accessors()  # one entry per child, of optree's own kinds
        for child, accessor in reversed(list(zip(children, accessors))):
            entry = accessor[0]
            exact = exact and (isinstance(entry, optree.SequenceEntry) or type(entry.entry) is str)
            stack.append((child, (*entries, entry)))
    return Structure(tuple(paths), tuple(key_types), tuple(empty), exact)


def _empty_kind(spec) -> str:
    if spec.kind == optree.PyTreeKind.NONE:
        return "None"
    if issubclass(spec.type, tuple):
        return "Tuple"
    return "List" if issubclass(spec.type, list) else "Dict"


def _key_type(entry) -> int:
    named = (optree.NamedTupleEntry, optree.StructSequenceEntry)
    if isinstance(entry, optree.SequenceEntry) and not isinstance(entry, named):
        return layout.KEY_SEQUENCE
    return layout.KEY_MAPPING


def leaf_paths(tree: Any) -> tuple[list, list[tuple[str, ...]], list[tuple[int, ...]], Any]:
    """`(leaves, paths, key_types, treedef)` of a pytree, paths as tuples of strings."""
    leaves, treedef = optree.tree_flatten(tree, namespace=NAMESPACE)
    found, _ = of_treedef(treedef)
    return leaves, list(found.paths), list(found.key_types), treedef


def empty_nodes(tree: Any) -> list[tuple[tuple[str, ...], tuple[int, ...], str]]:
    """The empty containers of a pytree (`{}`, `()`, `None`, an empty NamedTuple) by path."""
    treedef = optree.tree_structure(tree, namespace=NAMESPACE)
    return list(of_treedef(treedef)[0].empty_nodes)


__all__ = ["Structure", "empty_nodes", "leaf_paths", "of_treedef"]
