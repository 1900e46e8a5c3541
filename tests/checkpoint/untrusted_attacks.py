"""The crafted and damaged checkpoints of test_untrusted.py: pristine ones and the ways to spoil
them. Each attack is a function of a checkpoint directory that changes it in place; files are
always replaced (unlinked, then written), never edited in place, because the copies the attacks
work on share unchanged files with the pristine checkpoint as hard links."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import struct
import zlib

import numpy as np
import tensorstore as ts

from functrain.checkpoint import layout

MARKER_ENV = "FUNCTRAIN_PWNED_MARKER"


class Payload:
    """Unpickling this creates the marker file: proof that code from a checkpoint ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pickle_bytes(marker: str, protocol: int) -> bytes:
    return pickle.dumps(Payload(marker), protocol=protocol)


# -- file helpers --------------------------------------------------------------------------------


def replace(path: str, data: bytes) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def edit_json(d: str, name: str, fn, fix: bool = True) -> None:
    """Change a JSON file of checkpoint `d` in place with `fn(obj)` (its result is ignored);
    with `fix`, also recompute COMMIT.json's digests, as a deliberate attacker would."""
    path = os.path.join(d, name)
    obj = json.loads(read(path))
    fn(obj)
    replace(path, layout.dump_json(obj))
    if fix:
        fix_digests(d)


def fix_digests(d: str) -> None:
    """Make COMMIT.json's digests match the files as they are now."""
    commit_path = os.path.join(d, layout.COMMIT_FILE)
    if not os.path.isfile(commit_path) or os.path.islink(commit_path):
        return
    try:
        commit = json.loads(read(commit_path))
    except ValueError:  # COMMIT.json itself is the attack
        return
    tree = os.path.join(d, layout.TREE_FILE)
    if os.path.isfile(tree) and not os.path.islink(tree):
        commit["tree_blake2b"] = layout.digest(read(tree))
    for name in list(commit.get("files", {})):
        path = os.path.join(d, name)
        if os.path.isfile(path) and not os.path.islink(path):
            commit["files"][name] = layout.digest(read(path))
    replace(commit_path, layout.dump_json(commit))


def files_of(d: str) -> list[str]:
    """Every file of a checkpoint, relative to it, sorted."""
    out = []
    for dirpath, _, names in os.walk(d):
        out.extend(os.path.relpath(os.path.join(dirpath, n), d) for n in names)
    return sorted(out)


def deep(levels: int, leaf=0):
    """Text of a JSON value nested `levels` deep (built as text: no recursion here)."""
    return "[" * levels + json.dumps(leaf) + "]" * levels


def tree_leaf(d: str, key: str) -> dict:
    return next(
        x for x in json.loads(read(os.path.join(d, "tree.json")))["leaves"] if x["key"] == key
    )


def set_leaf(d: str, key: str, **changes) -> None:
    def edit(tree):
        leaf = next(x for x in tree["leaves"] if x["key"] == key)
        leaf.update(changes)

    edit_json(d, layout.TREE_FILE, edit)


def set_zarr(d: str, key: str, **changes) -> None:
    def edit(meta):
        meta.update(changes)

    edit_json(d, f"{key}/zarr.json", edit)


def set_codecs(d: str, key: str, codecs) -> None:
    set_zarr(d, key, codecs=codecs)


def chunk_shape_of(d: str, key: str, chunks) -> None:
    """Change a leaf's chunk shape consistently in tree.json and zarr.json."""
    set_leaf(d, key, chunks=chunks)
    set_zarr(d, key, chunk_grid={"name": "regular", "configuration": {"chunk_shape": chunks}})


def shape_of(d: str, key: str, shape, chunks=None) -> None:
    """Change a leaf's shape consistently in tree.json and zarr.json."""
    chunks = chunks if chunks is not None else [max(1, min(s, 4)) for s in shape]
    set_leaf(d, key, shape=shape, chunks=chunks)
    set_zarr(
        d,
        key,
        shape=shape,
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": chunks}},
    )


def make_fifo(path: str) -> None:
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.mkfifo(path)


def make_socket(path: str) -> None:
    os.unlink(path)
    # Bound by its name from inside its folder: an AF_UNIX path is limited to 107 bytes, and
    # pytest's temporary folders can be longer than that.
    here = os.getcwd()
    os.chdir(os.path.dirname(path))
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.basename(path))
        sock.close()
    finally:
        os.chdir(here)


def symlink(path: str, target: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


# -- compression bombs ---------------------------------------------------------------------------


def gzip_bomb(nbytes: int) -> bytes:
    """A gzip stream of `nbytes` zeros (about a thousandth of that in size)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(nbytes >> 20)]
    return b"".join(parts) + packer.flush()


def zstd_bomb(nbytes: int) -> bytes:
    """A zstd frame of `nbytes` zeros: run-length blocks of 128 KiB, 4 bytes each."""
    frame = struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", nbytes)
    block = 1 << 17
    count = -(-nbytes // block)
    for i in range(count):
        size = min(block, nbytes - i * block)
        header = (size << 3) | (1 << 1) | (1 if i == count - 1 else 0)  # RLE block
        frame += struct.pack("<I", header)[:3] + b"\0"
    return frame


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def shard_with(inner: bytes) -> bytes:
    """A `sharding_indexed` shard file holding one inner chunk (index at the end)."""
    index = struct.pack("<QQ", 0, len(inner))
    return inner + index + struct.pack("<I", crc32c(index))


# -- orbax-layout checkpoints (what orbax-checkpoint writes, made with tensorstore alone) ---------

ORBAX_VALUES = {
    "params.w": np.arange(12, dtype=np.float32).reshape(4, 3),
    "params.b": np.arange(5, dtype=np.float64) / 3,
    "step": np.asarray(42, dtype=np.int64),
}


def _orbax_metadata(use_ocdbt: bool, use_zarr3: bool) -> dict:
    entries = {}
    for key in ORBAX_VALUES:
        path = key.split(".")
        entries[str(tuple(path))] = {
            "key_metadata": [{"key": k, "key_type": 2} for k in path],
            "value_metadata": {
                "value_type": "scalar" if key == "step" else "np.ndarray",
                "skip_deserialize": False,
            },
        }
    return {"tree_metadata": entries, "use_ocdbt": use_ocdbt, "use_zarr3": use_zarr3}


def orbax_zarr3_spec(d: str, key: str, value: np.ndarray) -> dict:
    shape = list(value.shape)
    return {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": os.path.join(d, key) + "/"},
        "metadata": {
            "shape": shape,
            "data_type": value.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shape}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": shape,
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "zstd", "configuration": {"level": 3, "checksum": False}},
                        ],
                        "index_codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                    },
                }
            ],
        },
        "store_data_equal_to_fill_value": True,
    }


def write_orbax(d: str, use_ocdbt: bool, use_zarr3: bool) -> None:
    """An orbax-layout checkpoint of ORBAX_VALUES at `d`."""
    os.makedirs(d)
    for key, value in ORBAX_VALUES.items():
        if use_zarr3:
            spec = orbax_zarr3_spec(d, key, value)
        else:
            base = {"driver": "file", "path": d + "/"}
            kvstore = (
                {"driver": "ocdbt", "base": base, "path": key + "/"}
                if use_ocdbt
                else {"driver": "file", "path": os.path.join(d, key) + "/"}
            )
            spec = {
                "driver": "zarr",
                "kvstore": kvstore,
                "metadata": {
                    "shape": list(value.shape),
                    "chunks": list(value.shape),
                    "dtype": value.dtype.str,
                    "compressor": {"id": "zstd", "level": 1},
                    "dimension_separator": ".",
                },
            }
        array = ts.open(spec, create=True).result()
        array.write(value).result()
    with open(os.path.join(d, layout.ORBAX_METADATA), "w") as f:
        json.dump(_orbax_metadata(use_ocdbt, use_zarr3), f)
    with open(os.path.join(d, layout.ORBAX_CHECKPOINT_METADATA), "w") as f:
        json.dump({"item_handlers": "PyTreeCheckpointHandler"}, f)
    with open(os.path.join(d, layout.ORBAX_COMMIT), "w") as f:
        f.write("Checkpoint commit was successful")
