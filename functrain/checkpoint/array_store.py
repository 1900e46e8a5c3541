"""Where a checkpoint's arrays live: a directory per leaf, or one consolidated OCDBT database.

A leaf's zarr3 array is a directory holding `zarr.json` and its chunk files. On a local disk a
small state is mostly file-system work: 100 leaves are ~300 directories and files to create, and
that, not the bytes, is what its save costs (0.15 s against 12 ms for `torch.save` + fsync). A
single-rank save of a small state therefore writes every array -- the same `zarr.json` and the
same chunks, under the same keys -- into one OCDBT database (tensorstore's consolidated key-value
store, the one orbax uses by default): a manifest and a data file. The checkpoint stays readable
by orbax (its `_METADATA` says `use_ocdbt`), and by any mesh (arrays are read by region either
way). Sharded saves keep a directory per leaf: ranks write their shards concurrently there,
which one OCDBT database cannot take without a coordinator.

COMMIT.json records the choice (`"arrays": "ocdbt"`, format version 2): a reader that predates it
refuses the checkpoint as too new instead of calling it damaged.

Example:
    >>> consolidates(world_size=1, nbytes=800_000, loc=resolve("/tmp/run/step_000000001"))
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorstore as ts

from . import local_chunk_writes, storage

# Below this many bytes of tensor data a single-rank local save consolidates its arrays. Above
# it, bytes dominate file count, and directories of plain chunk files load through mmap.
CONSOLIDATE_BELOW = 16 * 2**20
OCDBT = "ocdbt"
OCDBT_VERSION = 2  # the format version of a checkpoint whose arrays are consolidated


def consolidates(world_size: int, nbytes: int, loc: storage.Location) -> bool:
    """True when a save of `nbytes` of tensor data by `world_size` ranks into `loc` writes its
    arrays into one OCDBT database.

    Args:
        world_size: the number of saving ranks.
        nbytes: the bytes of tensor data saved.
        loc: the checkpoint directory.
    Returns:
        whether the arrays are consolidated.
    Example:
        >>> consolidates(2, 1000, loc)   # several ranks write shards: a directory per leaf
        False
    """
    return loc.is_local and world_size == 1 and nbytes < CONSOLIDATE_BELOW


def database(loc: storage.Location) -> dict:
    """The kvstore spec of the OCDBT database in checkpoint directory `loc`."""
    return {"driver": "ocdbt", "base": loc.kvstore}


def array_kvstore(loc: storage.Location, key: str, consolidated: bool) -> dict:
    """The kvstore spec of leaf `key`'s array in checkpoint directory `loc`."""
    if consolidated:
        return {**database(loc), "path": key + "/"}
    return loc.child(key).kvstore


def write_all(
    loc: storage.Location, files: dict[str, bytes], arrays: list[tuple[str, dict, tuple, Any]]
) -> Any:
    """Write `{name: bytes}` and every array into the OCDBT database of `loc` as one transaction
    (no fsync: the writer syncs); returns the transaction's commit, still running (its
    `.result()` raises the first failure), so the caller may prepare its own files meanwhile.

    Opening a zarr3 array costs ~100 us of work per leaf, the most of a small save. So arrays
    that are one whole chunk (every array of a small single-rank state) are encoded here, byte
    for byte the chunk tensorstore would write (the raw bytes and their crc32c), and written as
    plain keys. Others (a zero-size dimension) are opened and written as zarr3 arrays.

    Args:
        loc: the checkpoint directory.
        files: `{name: bytes}` written as they are (every array's zarr.json).
        arrays: `(key, zarr.json's content, region, data)` per array.
    Example:
        >>> done = write_all(loc, {"w/zarr.json": raw}, [("w", metadata, (), np.zeros(3, "f4"))])
        >>> done.result()
    """
    txn = ts.Transaction()
    store = ts.KvStore.open(database(loc), context=storage.CONTEXT).result()
    writes: list[Any] = [store.with_transaction(txn).write(n, data) for n, data in files.items()]
    # (dtype, shape) -> (a zarr.json, [(key, data)]) of the arrays that are one whole chunk
    whole: dict[tuple, tuple[dict, list]] = {}
    for name, metadata, region, data in arrays:
        chunks = metadata["chunk_grid"]["configuration"]["chunk_shape"]
        if list(data.shape) == metadata["shape"] == chunks:  # (so the region is all of it)
            group = (metadata["data_type"], data.shape)
            whole.setdefault(group, (metadata, []))[1].append((name, data))
            continue
        spec = {"driver": "zarr3", "metadata": metadata, "store_data_equal_to_fill_value": True}
        array = ts.open(
            spec, kvstore=store / (name + "/"), open=True, assume_metadata=True
        ).result()
        writes.append(array.with_transaction(txn)[region].write(data))
    for name, chunk in _encoded_chunks(list(whole.values())):
        writes.append(store.with_transaction(txn).write(name, chunk))
    for future in writes:
        future.result()
    return txn.commit_async()


def _encoded_chunks(groups: list[tuple[dict, list]]) -> list[tuple[str, bytes]]:
    """`(key, bytes)` of the one chunk of every array of `groups` (arrays of one dtype and
    shape, with the zarr.json of one of them): encoded as the direct local writes encode them
    (`local_chunk_writes.whole_chunk`: the bytes, then their crc32c by the CPU), for a fraction
    of what encoding through tensorstore costs; bool and non-native byte orders go through
    tensorstore (`_encoded_by_tensorstore`)."""
    out, rest = [], []
    for metadata, items in groups:
        if not local_chunk_writes.plain_bytes(items[0][1]):
            rest.append((metadata, items))
            continue
        tail = "".join("/0" for _ in metadata["shape"])  # a one-chunk array's chunk key
        out += [(f"{name}/c{tail}", local_chunk_writes.whole_chunk(data)) for name, data in items]
    return out + _encoded_by_tensorstore(rest)


def _encoded_by_tensorstore(groups: list[tuple[dict, list]]) -> list[tuple[str, bytes]]:
    """`_encoded_chunks`, encoded by tensorstore as one stacked array per group."""
    memory = ts.KvStore.open("memory://", context=ts.Context()).result()  # freed on return
    reads = []
    for number, (metadata, items) in enumerate(groups):
        shape = metadata["shape"]
        stacked = {
            **metadata,
            "chunk_grid": {"configuration": {"chunk_shape": [1, *shape]}, "name": "regular"},
            "shape": [len(items), *shape],
        }
        spec = {"driver": "zarr3", "metadata": stacked, "store_data_equal_to_fill_value": True}
        prefix = memory / f"{number}/"
        array = ts.open(spec, kvstore=prefix, create=True).result()
        stacked_data = np.stack([data for _, data in items])  # ours: no copy into tensorstore
        array.write(stacked_data, can_reference_source_data_indefinitely=True).result()
        tail = "".join("/0" for _ in shape)  # a one-chunk array's chunk key: c/0/0, or c
        for i, (name, _) in enumerate(items):
            reads.append((f"{name}/c{tail}", prefix.read(f"c/{i}{tail}")))
    out = []
    for name, future in reads:
        result = future.result()
        if result.state != "value":
            raise RuntimeError(f"the encoded chunk of {name} is missing")
        out.append((name, result.value))
    return out


def read_files(loc: storage.Location, names: list[str], max_bytes: int) -> dict:
    """`{name: bytes or None}` of the files `names` in the OCDBT database of `loc`; a value
    over `max_bytes` reads as empty (which the JSON parser refuses as truncated).

    Example:
        >>> read_files(loc, ["params.w/zarr.json"], 2**20)["params.w/zarr.json"][:1]
        b'{'
    """
    store = ts.KvStore.open(database(loc), context=storage.CONTEXT).result()
    out = {}
    for name, future in [(n, store.read(n)) for n in names]:
        result = future.result()
        value = bytes(result.value) if result.state == "value" else None
        out[name] = b"" if value is not None and len(value) > max_bytes else value
    return out


__all__ = [
    "CONSOLIDATE_BELOW",
    "OCDBT",
    "OCDBT_VERSION",
    "array_kvstore",
    "consolidates",
    "database",
    "read_files",
    "write_all",
]
