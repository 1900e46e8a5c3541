"""Untrusted array metadata, checked before tensorstore sees it.

A checkpoint's files may be damaged or crafted. tensorstore trusts an array's zarr.json: a huge
chunk shape makes it allocate until the process aborts (`std::bad_alloc`, uncatchable), and a
flipped endian codec or an added transpose loads wrong values without an error. So the reader
reads every zarr.json itself, accepts only the metadata functrain writes (and orbax's, for
interop), and hands tensorstore the validated metadata (`assume_metadata`), so tensorstore never
parses a file that was not checked. (The files around the arrays are checked by `local_tree`,
the memory a load needs by `memory`.)

Example:
    >>> meta = array_metadata(record)                    # what the writer stores as zarr.json
    >>> check_array_metadata(meta, url, record) == meta   # what the reader accepts
    True
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import layout
from .dtypes import TORCH_DTYPES, numpy_dtype
from .errors import CheckpointCorruptError

MAX_RANK = 32  # dimensions of an array (zarr and torch allow no more in practice)
MAX_ELEMENTS = 2**62
_ZARR3_KEYS = {
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "attributes",
    "dimension_names",
}
_ZARR2_KEYS = {
    "zarr_format",
    "shape",
    "chunks",
    "dtype",
    "compressor",
    "fill_value",
    "order",
    "filters",
    "dimension_separator",
}
# zarr v2 dtype strings orbax writes (little-endian or single-byte), by zarr3 name.
_ZARR2_DTYPES = {
    "|b1": "bool",
    "|u1": "uint8",
    "|i1": "int8",
    "<i2": "int16",
    "<i4": "int32",
    "<i8": "int64",
    "<u2": "uint16",
    "<u4": "uint32",
    "<u8": "uint64",
    "<f2": "float16",
    "<f4": "float32",
    "<f8": "float64",
    "<c8": "complex64",
    "<c16": "complex128",
    **{name: name for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")},
}


def _itemsize(dtype: str) -> int:
    return numpy_dtype(dtype).itemsize


def _bytes_codec(dtype: str) -> dict:
    # tensorstore writes no endianness for one-byte types; functrain writes what it wrote.
    if _itemsize(dtype) == 1:
        return {"name": "bytes"}
    return {"configuration": {"endian": "little"}, "name": "bytes"}


def fill_value(dtype: str) -> Any:
    """The fill value functrain (and tensorstore, by default) writes for a zarr3 data type."""
    if dtype == "bool":
        return False
    if dtype.startswith("complex"):
        return [0.0, 0.0]
    if dtype.startswith(("int", "uint")):
        return 0
    return 0.0


def array_metadata(record: layout.LeafRecord) -> dict:
    """The zarr.json of a tensor (or a 0-d scalar) leaf, exactly as functrain writes it."""
    return {
        "chunk_grid": {"configuration": {"chunk_shape": list(record.chunks)}, "name": "regular"},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [_bytes_codec(record.dtype), {"name": "crc32c"}],
        "data_type": record.dtype,
        "fill_value": fill_value(record.dtype),
        "node_type": "array",
        "shape": list(record.shape),
        "zarr_format": 3,
    }


def encode(metadata: dict) -> bytes:
    """zarr.json's bytes: sorted keys, no spaces (what tensorstore writes, byte for byte)."""
    return json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()


def _corrupt(url: str, why: str, reason: str = "metadata") -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{url}: {why}; the array's metadata is corrupted or was tampered with -- do not use "
        "this checkpoint, load an earlier one",
        reason=reason,
    )


def _sizes(value: Any, minimum: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_RANK
        and all(type(v) is int and minimum <= v < 2**62 for v in value)
    )


def _is_zero(value: Any, dtype: str) -> bool:
    """True for a zero fill value (any spelling tensorstore or orbax uses)."""
    if dtype.startswith("complex"):
        return isinstance(value, list) and len(value) == 2 and all(_is_zero(v, "f") for v in value)
    if dtype == "bool":
        return value is False or (type(value) is int and value == 0)
    return type(value) in (int, float) and value == 0


def check_array_metadata(
    meta: Any, url: str, record: layout.LeafRecord, *, orbax: bool = False
) -> dict:
    """Validate an untrusted zarr3 zarr.json; return the metadata tensorstore may open.

    A functrain checkpoint's arrays must say exactly what tree.json says (shape, data type,
    chunk shape) with functrain's codecs (bytes little-endian + crc32c) and a zero fill value.
    Arrays of orbax checkpoints (`orbax=True`, no tree.json) may instead use orbax's chain
    (`sharding_indexed` over bytes + zstd, its index checksummed) and any shape, bounded by the
    memory check of the load.

    Args:
        meta: the parsed zarr.json.
        url: the array's URL, for messages.
        record: the leaf's record (dtype/shape/chunks None for orbax checkpoints).
        orbax: accept orbax's codec chain.
    Returns:
        the metadata to give tensorstore (`assume_metadata`): it never reads zarr.json itself.
    Raises:
        CheckpointCorruptError: naming what is wrong.
    """
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
        raise _corrupt(url, "zarr.json is not zarr v3 array metadata")
    unknown = set(meta) - _ZARR3_KEYS
    if unknown:
        raise _corrupt(url, f"zarr.json has fields functrain does not write: {sorted(unknown)}")
    if meta.get("node_type") != "array":
        raise _corrupt(url, "zarr.json does not describe an array")
    shape, dtype = meta.get("shape"), meta.get("data_type")
    if not _sizes(shape, 0):
        raise _corrupt(url, f"zarr.json's shape {layout.summary(shape)} is not a list of sizes")
    if not isinstance(dtype, str) or dtype not in TORCH_DTYPES:
        raise _corrupt(
            url,
            f"zarr.json's data type {layout.summary(dtype)} is not one functrain "
            f"stores ({sorted(TORCH_DTYPES)})",
        )
    if record.dtype is not None and (dtype, tuple(shape)) != (record.dtype, record.shape):
        raise CheckpointCorruptError(
            f"{url}/zarr.json says {dtype}{list(shape)} but {layout.TREE_FILE} says "
            f"{record.dtype}{list(record.shape)}; the checkpoint was modified -- load an "
            "earlier one",
            reason="metadata",
        )
    if math.prod(shape) > MAX_ELEMENTS:
        raise _corrupt(url, f"shape {shape} has more elements than any tensor can")
    chunks = _chunk_shape(meta.get("chunk_grid"), shape, url)
    if record.chunks is not None and tuple(chunks) != record.chunks:
        raise _corrupt(
            url, f"zarr.json's chunk shape {chunks} is not tree.json's {list(record.chunks)}"
        )
    encoding = meta.get("chunk_key_encoding")
    if encoding not in (
        {"name": "default"},
        {"name": "default", "configuration": {"separator": "/"}},
    ):
        raise _corrupt(url, f"chunk key encoding {layout.summary(encoding)} is not zarr's default")
    if not _is_zero(meta.get("fill_value"), dtype):
        raise _corrupt(url, f"fill value {layout.summary(meta.get('fill_value'))} is not zero")
    if meta.get("attributes", {}) != {}:
        raise _corrupt(url, "zarr.json carries attributes functrain does not write")
    names = meta.get("dimension_names")
    if names is not None and names != [None] * len(shape):
        raise _corrupt(url, "zarr.json names dimensions, which functrain does not write")
    codecs = _normalized_codecs(meta.get("codecs"), dtype)
    functrain_chain = [_bytes_codec(dtype), {"name": "crc32c"}]
    if codecs != functrain_chain and not (orbax and _orbax_chain(codecs, chunks, dtype)):
        raise _corrupt(
            url,
            f"codecs {layout.summary(meta.get('codecs'), 400)} are not the chain functrain "
            "writes (bytes, little-endian, then crc32c)"
            + (" nor orbax's (sharding_indexed over bytes and zstd)" if orbax else ""),
            reason="metadata",
        )
    out = {
        "chunk_grid": {"configuration": {"chunk_shape": list(chunks)}, "name": "regular"},
        "chunk_key_encoding": {"name": "default"},
        "codecs": codecs,
        "data_type": dtype,
        "fill_value": fill_value(dtype),
        "node_type": "array",
        "shape": list(shape),
        "zarr_format": 3,
    }
    return out


def _chunk_shape(grid: Any, shape: list[int], url: str) -> list[int]:
    if not (
        isinstance(grid, dict)
        and set(grid) == {"name", "configuration"}
        and grid["name"] == "regular"
        and isinstance(grid["configuration"], dict)
        and set(grid["configuration"]) == {"chunk_shape"}
    ):
        raise _corrupt(url, f"chunk grid {layout.summary(grid)} is not a regular grid")
    chunks = grid["configuration"]["chunk_shape"]
    # A chunk is never larger than its array (an empty dimension has chunks of 1): a larger one
    # only makes the reader allocate memory no value needs.
    if not _sizes(chunks, 1) or len(chunks) != len(shape):
        raise _corrupt(url, f"chunk shape {layout.summary(chunks)} does not fit shape {shape}")
    if any(c > max(1, s) for c, s in zip(chunks, shape)):
        raise _corrupt(
            url, f"chunk shape {chunks} is larger than the array's shape {shape}", reason="metadata"
        )
    return chunks


def _normalized_codecs(codecs: Any, dtype: str) -> Any:
    """The codec list with the spellings that mean the same made one (never raises)."""
    if not isinstance(codecs, list) or len(codecs) > 4:
        return codecs
    out = []
    for codec in codecs:
        if not isinstance(codec, dict):
            return codecs
        name, config = codec.get("name"), codec.get("configuration")
        if set(codec) - {"name", "configuration"}:
            return codecs
        if name == "bytes":
            endian = (config or {}).get("endian") if isinstance(config, dict) else "invalid"
            if config is not None and set(config) - {"endian"}:
                return codecs
            if endian is None and _itemsize(dtype) == 1:
                out.append(_bytes_codec(dtype))
            elif endian == "little":
                out.append(
                    {"configuration": {"endian": "little"}, "name": "bytes"}
                    if _itemsize(dtype) > 1
                    else {"name": "bytes"}
                )
            else:
                return codecs
        elif name == "crc32c" and config in (None, {}):
            out.append({"name": "crc32c"})
        elif name == "sharding_indexed" and isinstance(config, dict):
            inner = dict(config)
            inner["codecs"] = _normalized_codecs(config.get("codecs"), dtype)
            inner["index_codecs"] = _normalized_codecs(config.get("index_codecs"), "uint64")
            out.append({"configuration": inner, "name": name})
        else:
            out.append(codec)
    return out


def _orbax_chain(codecs: list, chunks: list[int], dtype: str) -> bool:
    """True for the codecs orbax-checkpoint writes: one `sharding_indexed` over bytes + zstd."""
    if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
        return False
    config = codecs[0]["configuration"]
    if set(config) - {"chunk_shape", "codecs", "index_codecs", "index_location"}:
        return False
    inner = config.get("chunk_shape")
    if not _sizes(inner, 1) or len(inner) != len(chunks):
        return False
    if any(c > o or o % c for c, o in zip(inner, chunks)):
        return False
    if config.get("index_location", "end") not in ("start", "end"):
        return False
    if config.get("index_codecs") != [_bytes_codec("uint64"), {"name": "crc32c"}]:
        return False
    chain = config.get("codecs")
    if not isinstance(chain, list) or not chain or chain[0] != _bytes_codec(dtype):
        return False
    if len(chain) == 1:
        return True
    zstd = chain[1]
    conf = zstd.get("configuration") if isinstance(zstd, dict) else None
    return (
        len(chain) == 2
        and zstd.get("name") == "zstd"
        and isinstance(conf, dict)
        and set(conf) <= {"level", "checksum"}
        and type(conf.get("level", 0)) is int
        and -131072 <= conf.get("level", 0) <= 22
        and type(conf.get("checksum", False)) is bool
    )


def check_zarr2_metadata(meta: Any, url: str, record: layout.LeafRecord) -> dict:
    """Validate an orbax array's zarr v2 `.zarray`; return the metadata tensorstore may open.

    Accepts C order, no filters, a little-endian (or one-byte) dtype, and no compressor or zstd:
    what orbax writes. Fortran order or a big-endian dtype would load transposed or byte-swapped
    values, so they are refused.
    """
    if not isinstance(meta, dict) or meta.get("zarr_format") != 2:
        raise _corrupt(url, ".zarray is not zarr v2 array metadata")
    if set(meta) - _ZARR2_KEYS:
        raise _corrupt(url, f".zarray has unexpected fields {sorted(set(meta) - _ZARR2_KEYS)}")
    shape, dtype = meta.get("shape"), _ZARR2_DTYPES.get(meta.get("dtype"))
    if not _sizes(shape, 0) or math.prod(shape) > MAX_ELEMENTS:
        raise _corrupt(url, f".zarray's shape {layout.summary(shape)} is not a list of sizes")
    if dtype is None:
        raise _corrupt(
            url,
            f".zarray's dtype {layout.summary(meta.get('dtype'))} is not a "
            "little-endian type functrain loads",
        )
    chunks = meta.get("chunks")
    if not _sizes(chunks, 1) or len(chunks) != len(shape):
        raise _corrupt(url, f"chunks {layout.summary(chunks)} do not fit shape {shape}")
    if any(c > max(1, s) for c, s in zip(chunks, shape)):
        raise _corrupt(url, f"chunk shape {chunks} is larger than the array's shape {shape}")
    if meta.get("order") != "C" or meta.get("filters") is not None:
        raise _corrupt(url, "only C order without filters is accepted (orbax writes that)")
    compressor = meta.get("compressor")
    if compressor is not None and not (
        isinstance(compressor, dict)
        and set(compressor) <= {"id", "level"}
        and compressor.get("id") == "zstd"
        and type(compressor.get("level", 0)) is int
        and -131072 <= compressor.get("level", 0) <= 22
    ):
        raise _corrupt(url, f"compressor {layout.summary(compressor)} is not zstd")
    if meta.get("dimension_separator", ".") not in (".", "/"):
        raise _corrupt(url, "dimension separator is neither '.' nor '/'")
    fill = meta.get("fill_value")
    if fill is not None and not _is_zero(fill, dtype):
        raise _corrupt(url, f"fill value {layout.summary(fill)} is not zero or null")
    return {
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": meta["dtype"],
        "compressor": compressor,
        "fill_value": fill,
        "order": "C",
        "filters": None,
        "dimension_separator": meta.get("dimension_separator", "."),
    }


def metadata_dtype_shape(meta: dict) -> tuple[str, tuple[int, ...]]:
    """`(zarr3 data type, shape)` of validated metadata (zarr3 or zarr2)."""
    if meta["zarr_format"] == 2:
        return _ZARR2_DTYPES[meta["dtype"]], tuple(meta["shape"])
    return meta["data_type"], tuple(meta["shape"])


# -- local files ---------------------------------------------------------------------------------


# -- memory ----------------------------------------------------------------------------------------


__all__ = [
    "array_metadata",
    "check_array_metadata",
    "check_zarr2_metadata",
    "encode",
    "fill_value",
    "metadata_dtype_shape",
]
