"""Tensor <-> numpy conversion: exact for every storable dtype, bf16 and fp8 through ml_dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from ckpt_helpers import same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.checkpoint import dtypes

STORABLE = sorted(dtypes.ZARR_NAMES, key=str)


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(STORABLE),
    raw=st.binary(min_size=16, max_size=16),
    transpose=st.booleans(),
)
def test_round_trip_is_bitwise_for_any_bit_pattern(dtype, raw, transpose):
    width = torch.empty((), dtype=dtype).element_size()
    data = torch.frombuffer(bytearray(raw * width), dtype=torch.uint8)
    tensor = (data % 2 == 1) if dtype == torch.bool else data.view(dtype)
    tensor = tensor.reshape(4, -1)
    if transpose:
        tensor = tensor.t()  # a non-contiguous view
    array = dtypes.to_numpy(tensor)
    assert array.dtype == dtypes.numpy_dtype(dtypes.zarr_name(dtype))
    back = dtypes.from_numpy(np.ascontiguousarray(array), dtype)
    assert same_bits(back, tensor.contiguous())


def test_conversion_shares_memory_on_cpu():
    tensor = torch.arange(6, dtype=torch.bfloat16)
    array = dtypes.to_numpy(tensor)
    assert array.dtype == ml_dtypes.bfloat16
    assert np.shares_memory(array.view(np.int16), tensor.view(torch.int16).numpy())


def test_names_match_tensorstore_and_ml_dtypes():
    assert dtypes.zarr_name(torch.float8_e4m3fn) == "float8_e4m3fn"
    assert dtypes.numpy_dtype("float8_e5m2") == np.dtype(ml_dtypes.float8_e5m2)
    assert dtypes.torch_dtype("bfloat16") is torch.bfloat16


def test_unsupported_dtypes_are_named():
    with pytest.raises(TypeError, match="leaf 'x' has dtype torch.bits8"):
        dtypes.zarr_name(torch.bits8, "leaf 'x'")
    with pytest.raises(TypeError, match="data type 'string'"):
        dtypes.torch_dtype("string", "arr")
    with pytest.raises(TypeError, match="cannot become"):
        dtypes.from_numpy(np.zeros(2, np.float32), torch.float64)
