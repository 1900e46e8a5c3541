"""orbax's tree description (`_METADATA`): written beside functrain's own so that orbax (and
through it JAX) restores a functrain checkpoint, and read to load a checkpoint orbax wrote.

Example:
    >>> meta = orbax_metadata(records, with_array=set())
    >>> parse_orbax_metadata(meta, "_METADATA")[1]
    {'use_ocdbt': False, 'use_zarr3': True}
"""

from __future__ import annotations

from typing import Any

from .errors import CheckpointCorruptError
from .layout import KEY_MAPPING, KEY_SEQUENCE, LeafRecord, check_key, summary


def _orbax_entry(entry: Any) -> tuple | None:
    """`(path, key_types, value_type, skip_deserialize)` of an orbax tree entry, or None."""
    if not isinstance(entry, dict):
        return None
    keys, value = entry.get("key_metadata"), entry.get("value_metadata")
    if not isinstance(keys, list) or not keys or not isinstance(value, dict):
        return None
    path, key_types = [], []
    for k in keys:
        if not isinstance(k, dict) or type(k.get("key")) not in (str, int):
            return None
        key_type = k.get("key_type", KEY_MAPPING)
        if key_type not in (KEY_SEQUENCE, KEY_MAPPING):
            return None
        path.append(str(k["key"]))
        key_types.append(key_type)
    value_type = value.get("value_type")
    if not isinstance(value_type, str):
        return None
    return tuple(path), tuple(key_types), value_type, bool(value.get("skip_deserialize"))


def orbax_metadata(
    records: list[LeafRecord], with_array: set[str], empty_nodes: list | tuple = ()
) -> dict:
    """orbax's `_METADATA` for the leaves (scalars only where `with_array` has a 0-d array).

    Args:
        records: the leaves.
        with_array: keys of the scalar leaves that have a 0-d array (orbax reads those).
        empty_nodes: `(path, key_types, kind)` of empty containers, kind "Dict", "List",
            "Tuple" or "None" (orbax restores them as such, without reading anything).
    """
    tree = {}
    for path, key_types, kind in empty_nodes:
        tree[str(tuple(path))] = {
            "key_metadata": [{"key": k, "key_type": t} for k, t in zip(path, key_types)],
            "value_metadata": {"value_type": kind, "skip_deserialize": True},
        }
    for r in records:
        if r.kind == "tensor":
            value_type = "np.ndarray"
        elif r.kind == "str":
            value_type = "string"
        elif r.key in with_array:
            value_type = "scalar"
        else:
            continue
        tree[str(r.path)] = {
            "key_metadata": [{"key": k, "key_type": t} for k, t in zip(r.path, r.key_types)],
            "value_metadata": {"value_type": value_type, "skip_deserialize": False},
        }
    return {
        "tree_metadata": tree,
        "use_ocdbt": False,
        "use_zarr3": True,
        "store_array_data_equal_to_fill_value": True,
        "custom_metadata": None,
    }


def parse_orbax_metadata(obj: Any, file: str) -> tuple[list[LeafRecord], dict[str, bool]]:
    """Records of an orbax `_METADATA` (kinds "tensor" or "array-scalar"/"str") and its flags.

    Returns:
        the leaf records -- tensors without dtype/shape (read from zarr.json), scalars with kind
        "scalar-array" (value in a 0-d array) or "str" -- and `{"use_ocdbt", "use_zarr3"}`.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("tree_metadata"), dict):
        raise CheckpointCorruptError(
            f"{file} is not an orbax tree description (no 'tree_metadata'); load another checkpoint"
        )
    records = []
    for name, entry in obj["tree_metadata"].items():
        parsed = _orbax_entry(entry)
        if parsed is None:
            raise CheckpointCorruptError(
                f"{file}: entry {summary(name)} is malformed; load another checkpoint",
                reason="metadata",
            )
        path, key_types, value_type, skip = parsed
        if skip or value_type in ("None", "none"):
            continue
        kind = {"string": "str", "scalar": "scalar-array"}.get(value_type, "tensor")
        record = LeafRecord(path=path, key_types=key_types, kind=kind)
        check_key(record.key, "loading", file)
        records.append(record)
    flags = {"use_ocdbt": bool(obj.get("use_ocdbt", True)), "use_zarr3": bool(obj.get("use_zarr3"))}
    return records, flags


__all__ = ["orbax_metadata", "parse_orbax_metadata"]
