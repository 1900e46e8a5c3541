"""Read and replace one item of a batch by key, without modifying the batch.

Algorithms that touch inputs or targets follow Composer's convention: they take `input_key=0,
target_key=1`, which index a `(inputs, targets)` tuple or list; a string key indexes a dict; and a
`(getter, setter)` pair of functions handles any other batch layout (`setter(batch, value)` must
return the new batch).

Example:
    >>> batch = (torch.zeros(2, 3), torch.tensor([0, 1]))
    >>> new = set_item(batch, 0, torch.ones(2, 3))
    >>> bool(get_item(new, 0).sum() == 6), bool(get_item(batch, 0).sum() == 0)
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..data import num_samples
from ..tree import tree_map

BatchKey = int | str | tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]


def _is_accessor_pair(key: Any) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and all(callable(k) for k in key)


def get_item(batch: Any, key: BatchKey) -> Any:
    """The item of `batch` at `key`.

    Args:
        batch: a tuple/list (integer keys), a mapping (string keys), or anything a
            `(getter, setter)` key understands.
        key: an int, a str, or a `(getter, setter)` pair.
    Returns:
        the item (not copied).
    Raises:
        KeyError/IndexError/TypeError: naming the key and the batch layout, and how to fix it.
    Example:
        >>> get_item({"image": 1, "label": 2}, "label")
        2
    """
    if _is_accessor_pair(key):
        return key[0](batch)
    if isinstance(batch, Mapping):
        if key not in batch:
            raise KeyError(
                f"batch key {key!r} not found; the batch has keys {sorted(map(str, batch))}. "
                "Pass input_key=/target_key= naming the right entries"
            )
        return batch[key]
    if isinstance(batch, (tuple, list)):
        if not isinstance(key, int):
            raise TypeError(
                f"a {type(batch).__name__} batch is indexed by integers, got key {key!r}; "
                "use input_key=0, target_key=1 for (inputs, targets) batches"
            )
        if not -len(batch) <= key < len(batch):
            raise IndexError(
                f"batch key {key} is out of range for a batch of {len(batch)} items; "
                "pass input_key=/target_key= within range"
            )
        return batch[key]
    raise TypeError(
        f"cannot index a batch of type {type(batch).__name__} with key {key!r}; use a tuple, "
        "list or dict batch, or pass a (getter, setter) pair as the key"
    )


def set_item(batch: Any, key: BatchKey, value: Any) -> Any:
    """A new batch equal to `batch` with the item at `key` replaced by `value`.

    The input batch is never modified: tuples and lists are rebuilt, mappings are shallow-copied
    (a plain `dict` for any mapping type that cannot be rebuilt from a dict).

    Args:
        batch: a tuple/list, a mapping, or anything a `(getter, setter)` key understands.
        key: an int, a str, or a `(getter, setter)` pair.
        value: the new item.
    Returns:
        the new batch, of the same container type where possible.
    Example:
        >>> set_item([1, 2], 1, 5)
        [1, 5]
    """
    if _is_accessor_pair(key):
        return key[1](batch, value)
    get_item(batch, key)  # validates the key with a clear message
    if isinstance(batch, Mapping):
        items = dict(batch)
        items[key] = value
        try:
            return type(batch)(items)
        except TypeError:  # e.g. a read-only mapping proxy: a plain dict is the honest answer
            return items
    items = list(batch)
    items[key] = value
    if isinstance(batch, list):
        return items
    if hasattr(batch, "_fields"):  # a NamedTuple
        return type(batch)(*items)
    return type(batch)(items)


def take(value: Any, indices: torch.Tensor) -> Any:
    """Index every tensor leaf of `value` whose leading dimension is the batch's with `indices`.

    Works on a tensor or any pytree of tensors (so nested mixed targets permute consistently);
    scalars and tensors of another length are carried unchanged.

    Example:
        >>> take((torch.tensor([10, 20, 30]), 0.5), torch.tensor([2, 0]))
        (tensor([30, 10]), 0.5)
    """
    rows = num_samples(value)

    def index(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == rows:
            return x[indices.to(x.device)]
        return x

    return tree_map(index, value)
