"""A checkpoint's values as `like`'s leaves: shape and dtype checks, the box a DTensor needs,
tensors on `like`'s device and placements, and Python scalars of `like`'s kind.

Example:
    >>> check_fits(record, "float32", (3,), like_leaf, url)   # raises on a misfit
    >>> tensor = to_tensor(data, "float32", like_leaf, inplace=False, url=url)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import _torch
from .._lazy import is_dtensor
from . import layout
from .dtypes import TORCH_DTYPES, from_numpy, torch_dtype, zarr_name
from .errors import CheckpointError, CheckpointMismatchError
from .sharding import dtensor_from_local


def check_fits(record, dtype: str, shape, like_leaf: torch.Tensor, url: str) -> None:
    want_shape = tuple(like_leaf.shape)
    if tuple(shape) != want_shape:
        raise CheckpointMismatchError(
            f"{url}: leaf {record.key!r} has shape {list(shape)} in the checkpoint but "
            f"{list(want_shape)} in `like`; build `like` with the checkpoint's shapes (the same "
            f"model config), or pass ignore=({record.key!r},) to keep `like`'s value"
        )
    want = zarr_name(like_leaf.dtype, f"`like` leaf {record.key!r}")
    if dtype != want:
        raise CheckpointMismatchError(
            f"{url}: leaf {record.key!r} is {dtype} in the checkpoint but {want} in `like`; "
            f"cast `like` to {TORCH_DTYPES.get(dtype, dtype)} "
            f"before loading, or pass ignore=({record.key!r},)"
        )


def region_for(like_leaf: torch.Tensor, key: str) -> tuple[slice, ...]:
    """The box of the global array this rank needs for `like_leaf`."""
    if not is_dtensor(like_leaf):
        return ()
    from torch.distributed.tensor import Partial

    if any(isinstance(p, Partial) for p in like_leaf.placements):
        raise CheckpointMismatchError(
            f"`like` leaf {key!r} has a Partial placement, which has no single value to load into; "
            "give `like` Shard/Replicate placements"
        )
    shape, offset = _torch.local_shape_and_offset(
        like_leaf.shape, like_leaf.device_mesh, like_leaf.placements
    )
    if not offset:  # this rank is outside the tensor's mesh
        return tuple(slice(0, 0) for _ in like_leaf.shape)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def to_tensor(data: np.ndarray, dtype: str, like_leaf, inplace: bool, url: str) -> torch.Tensor:
    if not data.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d arrays into 1-d)
        data = data.copy(order="C")
    tensor = from_numpy(data, torch_dtype(dtype, url))
    if like_leaf is None:
        return tensor
    target = like_leaf.to_local() if is_dtensor(like_leaf) else like_leaf
    if inplace and target.device.type != "meta":
        with torch.no_grad():
            target.copy_(tensor)
        return like_leaf
    device = target.device
    if device.type == "meta":
        device = torch.device(like_leaf.device_mesh.device_type if is_dtensor(like_leaf) else "cpu")
    tensor = tensor.to(device)
    if device.type == "cpu" and target.is_pinned():  # an offloaded shard stays page-locked
        tensor = tensor.pin_memory()
    if target.requires_grad:
        tensor.requires_grad_(True)
    return dtensor_from_local(tensor, like_leaf) if is_dtensor(like_leaf) else tensor


def like_scalar_kind(like_leaf, record) -> str:
    kind = _scalar_kind(like_leaf)
    if kind is None:
        raise CheckpointError(
            f"`like` leaf {record.key!r} is a {type(like_leaf).__name__}; `like` may hold only "
            "tensors, DTensors and int/float/bool/str leaves"
        )
    return kind


def scalar_value(record, like_leaf, url: str) -> Any:
    """The value of a scalar leaf held in tree.json, as the kind `like_leaf` has."""
    kind = like_scalar_kind(like_leaf, record)
    if record.kind == kind or (kind == "float" and record.kind == "int"):
        return layout.SCALAR_KINDS[kind](record.value)
    raise CheckpointMismatchError(
        f"{url}: leaf {record.key!r} is a {record.kind} in the checkpoint but a {kind} in "
        f"`like`; build `like` from the same state definition or ignore=({record.key!r},)"
    )


def _scalar_kind(value) -> str | None:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    return None


def python_scalar(data: np.ndarray, like_leaf, record, url: str):
    if data.shape != ():
        raise CheckpointMismatchError(
            f"{url}: leaf {record.key!r} is an array of shape {list(data.shape)}, not a scalar"
        )
    value = data.item()
    kind = _scalar_kind(like_leaf) if like_leaf is not None else _scalar_kind(value)
    return layout.SCALAR_KINDS[kind](value) if kind else value


__all__ = [
    "check_fits",
    "like_scalar_kind",
    "python_scalar",
    "region_for",
    "scalar_value",
    "to_tensor",
]
