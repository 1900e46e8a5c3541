"""The saved state of callbacks and data loaders: one JSON string per `state_dict()`.

`fit` keeps each callback's `state_dict()` (and the data loader's position) in the state's
`extra` as one JSON string, a checkpoint leaf whose structure does not change however the state's
shape changes during the run. Tensors travel as tagged lists of numbers; reading one back is
bounded (an allowlist of dtypes, limited sizes and nesting) because a checkpoint is untrusted.

Example:
    >>> decode_state(encode_state({"best": None, "w": torch.ones(2)}))
    {'best': None, 'w': tensor([1., 1.])}
"""

from __future__ import annotations

import json
from typing import Any

import torch

__all__ = ["decode_state", "encode_state"]

_TENSOR_TAG = "__tensor__"
# The dtypes a saved tensor may name: an explicit allowlist, so that a string read from a
# checkpoint is never used to look up an arbitrary attribute of `torch`.
_STATE_DTYPES = {
    str(dtype).replace("torch.", ""): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
_MAX_STATE_DEPTH = 64  # nesting of a saved state (deeper would exhaust the recursion limit)
_MAX_STATE_ELEMENTS = 2**27  # elements of one saved tensor (a state_dict holds small ones)


def _to_json(value: Any, where: str, depth: int = 0) -> Any:
    if depth > _MAX_STATE_DEPTH:
        raise TypeError(f"{where} is nested more than {_MAX_STATE_DEPTH} levels deep; flatten it")
    if isinstance(value, torch.Tensor):
        name = str(value.dtype).replace("torch.", "")
        if name not in _STATE_DTYPES:
            raise TypeError(
                f"{where} is a {value.dtype} tensor; a saved state holds tensors of "
                f"{sorted(_STATE_DTYPES)} -- convert it first"
            )
        flat = value.detach().cpu().reshape(-1)
        if value.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        return {_TENSOR_TAG: name, "shape": list(value.shape), "data": flat.tolist()}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{where}: dict keys must be strings to be saved, got {key!r}")
        return {k: _to_json(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    raise TypeError(
        f"{where} is a {type(value).__name__}, which a checkpoint cannot hold; return numbers, "
        "strings, None, lists, str-keyed dicts or tensors from state_dict()"
    )


def _from_json(value: Any, where: str, depth: int = 0) -> Any:
    if depth > _MAX_STATE_DEPTH:
        raise ValueError(f"{where} is nested more than {_MAX_STATE_DEPTH} levels deep")
    if isinstance(value, dict):
        if _TENSOR_TAG in value:
            return _tensor_from_json(value, where)
        return {k: _from_json(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    return value


def _tensor_from_json(value: dict, where: str) -> torch.Tensor:
    dtype = _STATE_DTYPES.get(value[_TENSOR_TAG]) if isinstance(value[_TENSOR_TAG], str) else None
    if dtype is None:
        raise ValueError(
            f"{where} names dtype {str(value[_TENSOR_TAG])[:40]!r}, not one of {sorted(_STATE_DTYPES)}"
        )
    shape, data = value.get("shape"), value.get("data")
    if not (
        isinstance(shape, list)
        and len(shape) <= 32
        and all(type(n) is int and 0 <= n <= _MAX_STATE_ELEMENTS for n in shape)
    ):
        raise ValueError(f"{where}: 'shape' must be a list of sizes")
    count = 1
    for n in shape:
        count *= n
    per = 2 if dtype.is_complex else 1
    if (
        not isinstance(data, list)
        or count > _MAX_STATE_ELEMENTS
        or len(data) != count * per
        or not all(type(x) in (int, float, bool) for x in data)
    ):
        raise ValueError(f"{where}: 'data' must be {count * per} numbers for shape {shape}")
    if dtype.is_complex:
        real = torch.tensor(data, dtype=torch.float64).reshape(*shape, 2)
        return torch.view_as_complex(real).to(dtype)
    try:
        return torch.tensor(data, dtype=dtype).reshape(shape)
    except (RuntimeError, OverflowError, TypeError) as err:
        raise ValueError(f"{where}: its values do not fit {dtype} ({err})") from None


def encode_state(value: Any, where: str = "state") -> str:
    """A callback's (or a data loader's) `state_dict()` as one JSON string, a checkpoint leaf.

    One string per callback keeps the checkpoint's structure fixed however the state's shape
    changes during the run (a best value that starts as None, a growing history).

    Example:
        >>> decode_state(encode_state({"best": None, "w": torch.ones(2)}))
        {'best': None, 'w': tensor([1., 1.])}
    """
    return json.dumps(_to_json(value, where), allow_nan=True)


def decode_state(text: str) -> Any:
    """The inverse of `encode_state` (tuples come back as lists).

    The text comes from a checkpoint, so it is untrusted: tensors may only name the dtypes of
    an allowlist, sizes are bounded, and nesting is limited.

    Raises:
        ValueError: the text is not a state `encode_state` writes (what is wrong, in words);
            `preemption` adds which checkpoint and what to do.
    """
    if not isinstance(text, str):
        raise ValueError(f"a saved state is a JSON string, got a {type(text).__name__}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"it is not valid JSON ({err})") from None
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    return _from_json(value, "state")
