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

from collections.abc import Callable

import tensorstore as ts

from . import storage

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


def start_writes(loc: storage.Location, files: dict[str, bytes]) -> Callable[[], None]:
    """Start writing `{name: bytes}` into the OCDBT database of `loc` (no fsync: the writer
    syncs); returns the call that waits for every write (and raises the first failure).

    Example:
        >>> finish = start_writes(loc, {"params.w/zarr.json": b"{...}"})
        >>> finish()
    """
    store = ts.KvStore.open(database(loc), context=storage.CONTEXT).result()
    futures = [store.write(name, data) for name, data in files.items()]

    def finish() -> None:
        for future in futures:
            future.result()

    return finish


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
    "start_writes",
]
