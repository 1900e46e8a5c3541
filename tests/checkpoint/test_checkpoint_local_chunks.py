"""Local chunk files read directly: the same values as tensorstore, and every check it makes."""

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
from functrain.checkpoint import local_chunks, reader, storage, verify
from functrain.checkpoint.errors import CheckpointCorruptError

DTYPES = {
    "float32": np.float32,
    "int16": np.int16,
    "int8": np.int8,
    "float64": np.float64,
    "complex64": np.complex64,
    "bfloat16": ml_dtypes.bfloat16,
}


def _meta(shape, chunks, dtype: str) -> dict:
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    first = {"name": "bytes"} if itemsize == 1 else verify._bytes_codec(dtype)
    return {
        "chunk_grid": {"configuration": {"chunk_shape": list(chunks)}, "name": "regular"},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [first, {"name": "crc32c"}],
        "data_type": dtype,
        "fill_value": verify.fill_value(dtype),
        "node_type": "array",
        "shape": list(shape),
        "zarr_format": 3,
    }


def _write(root: str, key: str, values: np.ndarray, chunks, dtype: str) -> dict:
    """Write `values` as tensorstore writes a leaf's array; return its metadata."""
    meta = _meta(values.shape, chunks, dtype)
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": os.path.join(root, key) + "/"},
        "metadata": meta,
        "store_data_equal_to_fill_value": True,  # as functrain's writer: every chunk stored
    }
    array = ts.open(spec, create=True, context=storage.CONTEXT).result()
    array.write(values).result()
    return meta


def _tensorstore_read(root: str, key: str, meta: dict, region) -> np.ndarray:
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": os.path.join(root, key) + "/"},
        "metadata": meta,
        "fill_missing_data_reads": False,
    }
    array = ts.open(spec, open=True, assume_metadata=True, context=storage.CONTEXT).result()
    return array[region].read().result()


@st.composite
def arrays_and_regions(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 7)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, max(1, n))) for n in shape)
    region = []
    for n in shape:
        lo = draw(st.integers(0, n))
        region.append(slice(lo, draw(st.integers(lo, n))))
    whole = draw(st.booleans())
    return shape, chunks, draw(st.sampled_from(sorted(DTYPES))), () if whole else tuple(region)


@settings(max_examples=60, deadline=None)
@given(arrays_and_regions(), st.integers(0, 2**31 - 1))
def test_any_region_of_any_chunking_reads_what_tensorstore_reads(case, seed):
    """Law: for every shape, chunk shape (padded edge chunks included), dtype and region, the
    direct read gives tensorstore's values, bit for bit, as a writable C-contiguous array."""
    shape, chunks, dtype, region = case
    raw = np.random.default_rng(seed).integers(0, 256, (*shape, 16), dtype=np.uint8)
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    values = np.ascontiguousarray(raw[..., :itemsize]).view(DTYPES[dtype]).reshape(shape)
    with tempfile.TemporaryDirectory() as root:
        meta = _write(root, "leaf", values, chunks, dtype)
        loc = storage.resolve(root)
        assert local_chunks.direct(loc, meta)
        (got,) = local_chunks.read_arrays(loc, [("leaf", root + "/leaf", meta, region)])
        want = _tensorstore_read(root, "leaf", meta, region)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    assert got.tobytes() == np.ascontiguousarray(values[region]).tobytes()
    assert got.flags.c_contiguous and got.flags.writeable
    # torch's strides, an empty region's included (numpy's np.empty gives those strides of 0)
    assert tuple(s // got.itemsize for s in got.strides) == torch.empty(got.shape).stride()


@pytest.fixture
def saved(tmp_path):
    """A 10x4 float32 array in chunks of 4x4: two whole chunks and a padded edge one."""
    values = np.arange(40, dtype=np.float32).reshape(10, 4)
    meta = _write(str(tmp_path), "w", values, (4, 4), "float32")
    return str(tmp_path), meta, values


def _read(saved, region=()):
    root, meta, _ = saved
    return local_chunks.read_arrays(storage.resolve(root), [("w", root + "/w", meta, region)])[0]


def _flip(path: str, offset: int) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[offset] ^= 0x01
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize(
    "offset, region",
    [(5, ()), (5, (slice(1, 3), slice(0, 4))), (-2, ())],
    ids=["payload-direct", "payload-partial", "checksum"],
)
def test_a_flipped_bit_fails_the_digest(saved, offset, region):
    _flip(os.path.join(saved[0], "w", "c", "0", "0"), offset)
    with pytest.raises(CheckpointCorruptError, match=r"w: chunk c/0/0 fails its crc32c digest"):
        _read(saved, region)


def test_a_chunk_of_the_wrong_size_is_refused_before_it_is_read(saved):
    with open(os.path.join(saved[0], "w", "c", "2", "0"), "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointCorruptError, match=r"c/2/0 has 69 bytes, not the 68") as err:
        _read(saved)
    assert err.value.reason == "chunk"


def test_a_missing_chunk_is_an_error_not_zeros(saved):
    os.remove(os.path.join(saved[0], "w", "c", "1", "0"))
    with pytest.raises(CheckpointCorruptError, match=r"c/1/0 is missing"):
        _read(saved)
    assert _read(saved, (slice(0, 4), slice(0, 4))).tolist() == saved[2][:4].tolist()


def test_no_link_is_followed_at_any_level(saved, tmp_path_factory):
    root = saved[0]
    elsewhere = str(tmp_path_factory.mktemp("elsewhere"))
    os.rename(os.path.join(root, "w", "c"), os.path.join(elsewhere, "c"))
    os.symlink(os.path.join(elsewhere, "c"), os.path.join(root, "w", "c"))
    with pytest.raises(CheckpointCorruptError, match="symbolic link") as err:
        _read(saved)
    assert err.value.reason == "unsafe"


def test_a_fifo_in_place_of_a_chunk_is_refused_without_blocking(saved):
    chunk = os.path.join(saved[0], "w", "c", "0", "0")
    os.remove(chunk)
    os.mkfifo(chunk)
    with pytest.raises(CheckpointCorruptError, match="not a regular file") as err:
        _read(saved)
    assert err.value.reason == "unsafe"


def test_only_local_functrain_arrays_are_read_directly(saved):
    root, meta, _ = saved
    assert local_chunks.direct(storage.resolve(root), meta)
    assert not local_chunks.direct(storage.resolve("memory://x"), meta)
    flags = dict(meta, data_type="bool", codecs=[{"name": "bytes"}, {"name": "crc32c"}])
    assert not local_chunks.direct(storage.resolve(root), flags)
    zstd = dict(meta, codecs=[*meta["codecs"][:1], {"name": "zstd"}, {"name": "crc32c"}])
    assert not local_chunks.direct(storage.resolve(root), zstd)


def test_load_reads_a_local_checkpoint_without_tensorstore(tmp_path, monkeypatch):
    state = {"w": torch.randn(6, 5), "b": torch.arange(7, dtype=torch.int64), "lr": 0.5}
    checkpoint.save(tmp_path / "ckpt", state)

    def refuse(*args, **kwargs):
        raise AssertionError("tensorstore opened an array of a local functrain checkpoint")

    monkeypatch.setattr(reader.ts, "open", refuse)
    loaded = checkpoint.load(tmp_path / "ckpt", like={k: v * 0 for k, v in state.items()})
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    assert loaded["lr"] == 0.5


def test_crafted_tiny_chunks_fail_at_the_first_missing_one(tmp_path):
    """Metadata declaring ten million one-element chunks, none written: the load fails on the
    first missing chunk (chunks are handed to the workers as they free up, not listed first)."""
    meta = _meta((10**7,), (1,), "int8")
    (tmp_path / "w" / "c").mkdir(parents=True)
    loc = storage.resolve(str(tmp_path))
    with pytest.raises(CheckpointCorruptError, match=r"chunk c/0 is missing"):
        local_chunks.read_arrays(loc, [("w", str(tmp_path / "w"), meta, ())])
