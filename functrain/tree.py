"""Pytree helpers on optree: map, leaves with paths, and path <-> checkpoint key.

Every structure in functrain (the train state, optimizer states, metrics) is an optree pytree whose
leaves are tensors or plain scalars. These helpers name each leaf by a stable dotted path, which is
the key a checkpoint stores it under.

Example:
    >>> import torch
    >>> from functrain import tree
    >>> tree.leaves_with_paths({"w": torch.zeros(2), "opt": (1, 2.0)})
    [('opt.0', 1), ('opt.1', 2.0), ('w', tensor([0., 0.]))]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch

# Tensors, numbers and None are leaves; containers and registered dataclasses are nodes.
NONE_IS_LEAF = False
NAMESPACE = "functrain"


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """Apply `fn` to every leaf (and the matching leaves of `rest`); return the same structure."""
    return optree.tree_map(fn, tree, *rest, namespace=NAMESPACE)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of `tree` in a fixed order."""
    return optree.tree_leaves(tree, namespace=NAMESPACE)


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """`(leaves, treespec)`; rebuild with `tree_unflatten(treespec, leaves)`."""
    return optree.tree_flatten(tree, namespace=NAMESPACE)


def tree_unflatten(treespec: Any, leaves: list[Any]) -> Any:
    """Inverse of `tree_flatten`."""
    return optree.tree_unflatten(treespec, leaves)


def key_to_str(entry: Any) -> str:
    """One accessor entry as a string: a NamedTuple or dataclass field by name, else its key."""
    for attr in ("field", "name"):
        value = getattr(entry, attr, None)
        if isinstance(value, str):
            return value
    return str(entry.entry)


def path_to_key(path: tuple[Any, ...]) -> str:
    """A leaf path as a dotted checkpoint key: ("params", "fc.weight") -> "params.fc.weight"."""
    return ".".join(str(p) for p in path) if path else "<root>"


def leaves_with_paths(tree: Any) -> list[tuple[str, Any]]:
    """`[(dotted_path, leaf), ...]` in flatten order.

    Args:
        tree: any pytree.
    Returns:
        pairs of the dotted path of a leaf and the leaf.
    """
    return [(path_to_key(p), leaf) for p, leaf in zip(tree_paths(tree), tree_leaves(tree))]


def tree_paths(tree: Any) -> list[tuple[str, ...]]:
    """Each leaf's path as a tuple of strings (NamedTuple fields by name, not index)."""
    accessors, _, _ = optree.tree_flatten_with_accessor(tree, namespace=NAMESPACE)
    return [tuple(key_to_str(e) for e in acc) for acc in accessors]


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """Only the tensor leaves of `tree`."""
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def tree_clone(tree: Any) -> Any:
    """A deep copy of every tensor leaf (scalars are immutable and shared)."""
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def tree_allclose(a: Any, b: Any, *, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """True when `a` and `b` have the same structure and every leaf matches within tolerance."""
    la, sa = tree_flatten(a)
    lb, sb = tree_flatten(b)
    if sa != sb:
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            x, y = torch.as_tensor(x), torch.as_tensor(y)
            if x.shape != y.shape or not torch.allclose(
                x.double(), y.double(), rtol=rtol, atol=atol, equal_nan=True
            ):
                return False
        elif x != y:
            return False
    return True


def fast_replace(obj: Any, changes: dict[str, Any]) -> Any:
    """A copy of the frozen dataclass `obj` with `changes`, without re-running `__init__`.

    `dataclasses.replace` costs tens of microseconds (it re-validates every field); the step
    replaces its state several times per call, which shows on steps that take well under a
    millisecond. Unknown field names still raise, as with `dataclasses.replace`.
    """
    unknown = changes.keys() - obj.__dataclass_fields__.keys()
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field(s) {sorted(unknown)}")
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def static_field(default: Any = None) -> Any:
    """A dataclass field that `register_dataclass` keeps as static metadata, not as a child.

    A static field is part of the tree's structure (its treespec), like a dict's keys: it is no
    leaf, so `tree_map` and `tree_leaves` never see it, `tree_map` over several trees requires it
    to be equal in all of them and copies it into the result, and a checkpoint (which stores
    leaves by path) never stores it; loading into a `like` tree keeps `like`'s.
    """
    import dataclasses

    return dataclasses.field(default=default, metadata={"static": True})


def register_dataclass(cls: type) -> type:
    """Register a frozen dataclass as a pytree node whose children are its fields, by name.

    Fields made with `static_field()` are kept in the treespec instead (see there).

    Example:
        >>> @register_dataclass
        ... @dataclasses.dataclass(frozen=True)
        ... class Pair:
        ...     a: int
        ...     b: int
    """
    import dataclasses

    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields if not f.metadata.get("static"))
    static = tuple(f.name for f in fields if f.metadata.get("static"))

    def flatten(obj):
        return (
            tuple(getattr(obj, n) for n in names),
            tuple(getattr(obj, n) for n in static),
            names,
        )

    def unflatten(meta, children):
        return cls(**dict(zip(names, children)), **dict(zip(static, meta)))

    optree.register_pytree_node(
        cls, flatten, unflatten, namespace=NAMESPACE, path_entry_type=optree.GetAttrEntry
    )
    return cls
