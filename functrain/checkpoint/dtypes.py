"""Tensor <-> numpy conversion for every dtype a checkpoint stores, bf16 and fp8 included.

numpy has no bfloat16 or float8; ml_dtypes provides them, and tensorstore's zarr3 driver stores
them under the same names. Conversion reinterprets the bytes (`view`), so it is exact and, for CPU
tensors, copy-free.

Example:
    >>> t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    >>> a = to_numpy(t)
    >>> a.dtype.name
    'bfloat16'
    >>> torch.equal(from_numpy(a, torch.bfloat16), t)
    True
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

# torch dtype -> zarr3 / tensorstore data_type name.
ZARR_NAMES: dict[torch.dtype, str] = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
    torch.bfloat16: "bfloat16",
}
for _torch_name, _ml_name in [
    ("uint16", "uint16"),
    ("uint32", "uint32"),
    ("uint64", "uint64"),
    ("float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e5m2", "float8_e5m2"),
    ("float8_e4m3fnuz", "float8_e4m3fnuz"),
    ("float8_e5m2fnuz", "float8_e5m2fnuz"),
    ("float8_e8m0fnu", "float8_e8m0fnu"),
]:
    if hasattr(torch, _torch_name):  # older torch builds lack some of them
        ZARR_NAMES[getattr(torch, _torch_name)] = _ml_name

TORCH_DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in ZARR_NAMES.items()}

# dtypes numpy lacks: stored as ml_dtypes, moved across as same-width integers.
_ML_DTYPES = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
_ML_DTYPES |= {"float8_e8m0fnu"}
_SAME_WIDTH_INT = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16)}


def zarr_name(dtype: torch.dtype, where: str = "") -> str:
    """The zarr3 data_type name of a torch dtype.

    Raises:
        TypeError: naming the leaf (`where`) when the dtype cannot be stored.
    """
    try:
        return ZARR_NAMES[dtype]
    except KeyError:
        raise TypeError(
            f"{where or 'a tensor'} has dtype {dtype}, which checkpoints cannot store; convert it "
            f"to one of {sorted(ZARR_NAMES.values())} first"
        ) from None


def torch_dtype(name: str, where: str = "") -> torch.dtype:
    """The torch dtype of a zarr3 data_type name (as written by `zarr_name`)."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise TypeError(
            f"{where or 'an array'} has data type {name!r}, which functrain cannot load into a "
            f"torch tensor; supported: {sorted(TORCH_DTYPES)}"
        ) from None


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype (ml_dtypes for bf16/fp8) of a zarr3 data_type name."""
    if name in _ML_DTYPES:
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's bytes with the matching (ml_)dtype; no copy."""
    name = zarr_name(tensor.dtype)
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if name in _ML_DTYPES:
        width = tensor.element_size()
        torch_int, _ = _SAME_WIDTH_INT[width]
        return tensor.view(torch_int).numpy().view(numpy_dtype(name))
    return tensor.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of `dtype` over the bytes of `array` (dtype names must agree); no copy."""
    name = zarr_name(dtype)
    if array.dtype != numpy_dtype(name):
        raise TypeError(f"array of dtype {array.dtype} cannot become a {dtype} tensor")
    if not array.flags.writeable:
        array = array.copy()  # torch.from_numpy warns on read-only memory
    if name in _ML_DTYPES:
        torch_int, np_int = _SAME_WIDTH_INT[array.dtype.itemsize]
        return torch.from_numpy(array.view(np_int)).view(dtype)
    return torch.from_numpy(array)
