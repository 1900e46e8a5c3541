"""Local chunk files written directly: the same files as tensorstore's zarr3 write, byte for byte."""

from __future__ import annotations

import os
import tempfile

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain import checkpoint
from functrain.checkpoint import layout, local_chunk_writes, storage, writer
from functrain.checkpoint.errors import CheckpointStorageError

DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float64": np.float64,
    "complex64": np.complex64,
    "int8": np.int8,
    "uint8": np.uint8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint64": np.uint64,
}


def _record(dtype: str, shape, chunks) -> layout.LeafRecord:
    return layout.LeafRecord(
        path=("w",), key_types=(2,), kind="tensor", dtype=dtype, shape=tuple(shape),
        chunks=tuple(chunks),
    )  # fmt: skip


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _random(dtype: str, shape, seed: int) -> np.ndarray:
    """Random bytes viewed as `dtype` (NaN payloads and all: the writers copy bytes)."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    raw = np.random.default_rng(seed).integers(0, 256, size=(*shape, itemsize), dtype=np.uint8)
    return raw.view(DTYPES[dtype]).reshape(shape)


@st.composite
def _layouts(draw):
    """A dtype, shape, chunk shape and a grid of rank regions made of whole (or edge) chunks."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    ndim = draw(st.integers(0, 3))
    shape = draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim))
    chunks = [draw(st.integers(1, n + 2)) for n in shape]
    # Each dimension cut at some chunk boundaries: every piece one rank's region.
    cuts = []
    for n, c in zip(shape, chunks):
        inner = list(range(c, n, c))
        chosen = sorted(draw(st.sets(st.sampled_from(inner), max_size=2))) if inner else []
        edges = [0, *chosen, n]
        cuts.append(list(zip(edges, edges[1:])))
    return dtype, shape, chunks, cuts


@settings(max_examples=120, deadline=None)
@given(_layouts(), st.integers(0, 2**31))
def test_direct_writes_are_tensorstores_bytes(case, seed):
    """Every region of every layout (edge chunks padded with zeros, 0-d, 1-byte and ml_dtypes)
    gives the files tensorstore's zarr3 write gives: the same keys, every byte equal."""
    dtype, shape, chunks, cuts = case
    record = _record(dtype, shape, chunks)
    values = _random(dtype, shape, seed)
    with tempfile.TemporaryDirectory() as tmp:
        ours = storage.resolve(os.path.join(tmp, "ours"))
        theirs = storage.resolve(os.path.join(tmp, "theirs"))
        array = ts.open(writer.array_spec(theirs, record), create=True).result()
        os.remove(os.path.join(theirs.local_path, "w", "zarr.json"))
        regions = [tuple(slice(lo, hi) for lo, hi in box) for box in _product(cuts)]
        items = []
        for region in regions:
            data = values[region] if region else values
            assert local_chunk_writes.direct(ours, record, region, data)
            array[region].write(data).result()
            items.append(("w", shape, chunks, region, data))
        local_chunk_writes.write_arrays(ours, items, writeback=True)
        mine, expected = _files(ours.local_path), _files(theirs.local_path)
        assert sorted(mine) == sorted(expected)
        for name, content in expected.items():
            assert mine[name] == content, name


def _product(cuts):
    import itertools

    return list(itertools.product(*cuts))


def test_non_contiguous_data_and_edge_padding_in_inner_dims():
    """A region held in a transposed (non-C-contiguous) array, and chunks cut by the array's
    edge in an inner dimension, are written as tensorstore writes them."""
    values = np.arange(35, dtype=np.int32).reshape(7, 5).T.copy().T  # Fortran order
    record = _record("int32", (7, 5), (3, 2))
    with tempfile.TemporaryDirectory() as tmp:
        ours = storage.resolve(os.path.join(tmp, "ours"))
        theirs = storage.resolve(os.path.join(tmp, "theirs"))
        ts.open(writer.array_spec(theirs, record), create=True).result().write(values).result()
        os.remove(os.path.join(theirs.local_path, "w", "zarr.json"))
        assert local_chunk_writes.direct(ours, record, (), values)
        local_chunk_writes.write_arrays(ours, [("w", (7, 5), (3, 2), (), values)])
        assert _files(ours.local_path) == _files(theirs.local_path)


def test_direct_declines_what_tensorstore_keeps():
    """Unaligned regions (a chunk shared by two ranks), bool, zero-size data, non-local
    storage and byte-swapped data go to tensorstore."""
    loc = storage.resolve("/tmp/unused")
    record = _record("float32", (8,), (4,))
    data = np.zeros(4, np.float32)
    assert local_chunk_writes.direct(loc, record, (slice(4, 8),), data)
    assert not local_chunk_writes.direct(loc, record, (slice(2, 6),), data)
    assert not local_chunk_writes.direct(loc, record, (slice(0, 3),), data[:3])
    assert not local_chunk_writes.direct(loc, record, (slice(4, 8),), data.astype(">f4"))
    assert not local_chunk_writes.direct(storage.resolve("memory://x"), record, (), data)
    assert not local_chunk_writes.direct(loc, _record("bool", (8,), (4,)), (), np.zeros(8, bool))
    empty = _record("float32", (0, 3), (1, 3))
    assert not local_chunk_writes.direct(loc, empty, (), np.zeros((0, 3), np.float32))


def test_write_failure_names_the_chunk(tmp_path):
    """A file standing where a chunk directory must go fails with a storage error naming it."""
    loc = storage.resolve(str(tmp_path))
    (tmp_path / "w").write_bytes(b"in the way")
    with pytest.raises(CheckpointStorageError, match="writable"):
        local_chunk_writes.write_arrays(loc, [("w", (4,), (4,), (), np.zeros(4, np.float32))])


def test_saved_checkpoint_loads_and_its_chunks_are_tensorstores(tmp_path):
    """A non-consolidated local save (direct chunk files) loads back exactly."""
    state = {
        "w": torch.randn(300, 70),
        "b": torch.randn(13).to(torch.bfloat16),
        "i": torch.arange(5, dtype=torch.int64),
        "flag": torch.tensor([True, False]),
        "step": 3,
    }
    big = {**state, "pad": torch.zeros(5 * 2**20, dtype=torch.float32)}  # over the OCDBT limit
    path = checkpoint.save(str(tmp_path / "ckpt"), big)
    assert not os.path.exists(os.path.join(path, "ocdbt.manifest"))
    loaded = checkpoint.load(path, big)
    for key, value in big.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[key], value), key
        else:
            assert loaded[key] == value
