"""Saving: stage a state's leaves on the host, write each rank's shards, commit.

Saving is two steps so that the manager can save asynchronously:

1. `stage(state)` (in `staging`) flattens the state, describes every leaf, and takes this rank's
   data off the device (for an asynchronous save, into host buffers reused from one save to the
   next). Only this step has to block training.
2. `write(staged, location)` writes the arrays -- each rank only its own shards, replicas once --
   then rank 0 writes the tree description and, last, the commit marker. On a local file system
   the checkpoint is written into `<name>.tmp/` and renamed into place once committed, so a
   directory without `.tmp` is always complete; on object stores the marker decides.

Ranks agree after each phase (an all-reduce of "did it work"), so one rank failing makes every
rank raise instead of waiting forever at a barrier.

Example:
    >>> staged = stage(state)
    >>> write(staged, resolve("/tmp/run/step_000000100"))
    '/tmp/run/step_000000100'
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorstore as ts

from . import array_store, durable, layout, local_chunk_writes, orbax_layout, storage, verify
from .agreement import agree, max_over_ranks, phase, share_text
from .errors import CheckpointError
from .staging import Staged, StagedLeaf, stage

__all__ = [
    "agree",
    "array_spec",
    "committed",
    "max_over_ranks",
    "save",
    "share_text",
    "write",
]


def array_spec(
    loc: storage.Location, record: layout.LeafRecord, consolidated: bool = False
) -> dict:
    """The tensorstore spec of a leaf's zarr3 array inside checkpoint directory `loc` (in its
    OCDBT database when `consolidated`, see `array_store`).

    The metadata is functrain's own (`verify.array_metadata`); rank 0 writes it as zarr.json
    and every writer opens the array assuming it, so tensorstore never reads it back.
    """
    return {
        "driver": "zarr3",
        "kvstore": array_store.array_kvstore(loc, record.key, consolidated),
        "metadata": verify.array_metadata(record),
        # Write chunks even when they equal the fill value, so that a missing chunk file always
        # means damage (loads use fill_missing_data_reads=False and fail on it).
        "store_data_equal_to_fill_value": True,
    }


def _unsynced(loc: storage.Location) -> storage.Location:
    """`loc` with every file written without fsync (local only): the writer makes them durable
    at once with `durable.sync_tree` before it writes the commit marker."""
    if not loc.is_local or not loc.fsync:
        return loc
    kvstore = {**loc.kvstore, "context": {"file_io_sync": False}}
    return dataclasses.replace(loc, kvstore=kvstore, fsync=False)


def _make_durable(loc: storage.Location) -> None:
    if loc.is_local and loc.fsync:
        _result_of(lambda: durable.sync_tree(loc.local_path), loc.url, "flushing to disk")


def _scalar_array(value: Any) -> np.ndarray | None:
    """The 0-d array orbax reads a scalar from (None for ints beyond 64 bits)."""
    if isinstance(value, bool):
        return np.asarray(value, dtype=np.bool_)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return np.asarray(value, dtype=np.int64)
        return np.asarray(value, dtype=np.uint64) if 0 <= value < 2**64 else None
    return None


def committed(loc: storage.Location) -> bool:
    """True when the checkpoint at `loc` carries its commit marker."""
    return storage.exists(loc, layout.COMMIT_FILE)


def write(
    staged: Staged,
    loc: storage.Location,
    *,
    group=None,
    overwrite: bool = False,
    before_write: Callable[[], None] | None = None,
    before_commit: Callable[[], None] | None = None,
    owner: dict | None = None,
    metrics: dict[str, float] | None = None,
) -> str:
    """Write a staged state as the checkpoint `loc` and commit it.

    Args:
        staged: the output of `stage` on this rank.
        loc: the checkpoint directory (`storage.resolve`).
        group: the process group of the saving ranks (every rank of it calls `write`).
        overwrite: replace a committed checkpoint already at `loc` (it stays intact until the new
            one is committed on file systems).
        before_write: run on rank 0 before anything is written (the manager's clean-up).
        before_commit: run on rank 0 just before the commit marker is written (the manager
            checks that it still holds its root's lease); an error aborts the commit.
        owner: who writes, recorded in COMMIT.json (the manager's lease identity); by default
            this host and process.
        metrics: values recorded with the checkpoint in COMMIT.json (and orbax's step metadata),
            by which a manager ranks its checkpoints (`keep_best`).
    Returns:
        the checkpoint's URL.
    Raises:
        CheckpointError: when `loc` holds a committed checkpoint and `overwrite` is False.
    """
    if committed(loc) and not overwrite:
        raise CheckpointError(
            f"{loc.url} already holds a committed checkpoint; pass overwrite=True to replace it "
            "or save under another path"
        )
    staged.wait_for_copies()  # the device-to-host copies `stage` queued have landed
    work = loc.sibling(loc.name + ".tmp") if loc.is_local else loc
    rank = staged.rank
    started = time.time()

    def prepare():
        if rank != 0:
            return
        if before_write is not None:
            before_write()
        if not loc.is_local and overwrite:
            storage.delete_file(loc, layout.COMMIT_FILE)  # un-commit first: never half a state
        storage.delete_dir(work)
        storage.make_dir(work)

    phase(prepare, group, "preparing", loc.url)
    scalar_arrays: set[str] = set()
    files: dict[str, str] = {}  # digests of the metadata files, for COMMIT.json
    consolidated = array_store.consolidates(staged.world_size, staged.nbytes, work)
    running: list = []  # a consolidated save's transaction, committing while rank 0 goes on
    phase(
        lambda: _write_arrays(staged, work, scalar_arrays, files, consolidated, running),
        group,
        "writing",
        loc.url,
    )

    def commit():
        try:
            if rank == 0:
                done = (started, consolidated, lambda: _wait(running, work.url))
                _commit(staged, work, scalar_arrays, done, files, owner, before_commit, metrics)
                if loc.is_local:
                    _move_into_place(work, loc)
        except BaseException:  # (a commit that went through waited for it before its marker)
            _wait(running, work.url, quiet=True)  # never left running past a failed save
            raise

    phase(commit, group, "committing", loc.url)
    return loc.url


def _write_arrays(
    staged: Staged,
    work: storage.Location,
    scalar_arrays: set[str],
    files: dict[str, str],
    consolidated: bool,
    running: list,
) -> None:
    """Write this rank's shards; rank 0 also writes every zarr.json (digests into `files`).
    Every file of the other ranks is durable on return (one flush for all of them, not one per
    file); rank 0's are made durable with its root files, by the one flush before the commit.
    A consolidated save's transaction is left committing in `running` (`_wait` ends it): rank
    0 prepares the metadata files meanwhile."""
    unsynced = _unsynced(work)
    arrays = []  # (record, data item) of every array this rank opens
    for item in staged.leaves:
        record = item.record
        if record.kind == "tensor":
            if staged.rank == 0 or item.data is not None:
                arrays.append((record, item))
        elif staged.rank == 0 and record.kind != "str":
            value = _scalar_array(record.value)
            if value is None:
                continue
            scalar = layout.LeafRecord(
                path=record.path,
                key_types=record.key_types,
                kind="tensor",
                dtype=value.dtype.name,
                shape=(),
                chunks=(),
            )
            arrays.append((scalar, StagedLeaf(scalar, (), value)))
            scalar_arrays.add(record.key)
    metadata: dict[str, bytes] = {}  # rank 0: every zarr.json, by file name
    as_json: dict[str, dict] = {}  # ... and its content, by key (a consolidated save's arrays)
    if staged.rank == 0:
        encoded: dict[tuple, tuple[dict, bytes]] = {}  # leaves of one shape share their zarr.json
        for r, _ in arrays:
            like = (r.dtype, r.shape, r.chunks)
            if like not in encoded:
                content = verify.array_metadata(r)
                encoded[like] = (content, verify.encode(content))
            as_json[r.key], metadata[layout.array_metadata_file(r.key)] = encoded[like]
        files.update({name: layout.digest(data) for name, data in metadata.items()})
    if consolidated:  # a single rank: rank 0 writes everything, in one transaction
        items = [(r.key, as_json[r.key], i.region, i.data) for r, i in arrays if i.data is not None]
        start = lambda: running.append(array_store.write_all(unsynced, metadata, items))  # noqa: E731
        _result_of(start, work.url, "writing")
        return
    if metadata:
        _result_of(lambda: storage.write_many(unsynced, metadata), work.url, "writing metadata of")
    flushes = work.is_local and work.fsync
    pending = []  # (url, future, item) so an error names the array it hit
    direct = []  # local chunk files written straight from the staged data (local_chunk_writes)
    for record, item in arrays:
        if item.data is None:
            continue
        if local_chunk_writes.direct(work, record, item.region, item.data):
            direct.append((record.key, record.shape, record.chunks, item.region, item.data))
            continue
        spec = array_spec(unsynced, record)
        future = ts.open(spec, open=True, assume_metadata=True, context=storage.CONTEXT)
        pending.append((work.file_url(record.key), future, item))
    writes = []
    for url, future, item in pending:
        array = _result(future, url, "opening")
        # No copy into tensorstore's buffers: the data is either staged (ours until the next
        # save) or the caller's tensors, which a synchronous save holds until committed.
        write = array[item.region].write(item.data, can_reference_source_data_indefinitely=True)
        writes.append((url, write, item.record.key))
    if direct:  # while tensorstore writes the others
        local_chunk_writes.write_arrays(work, direct, writeback=flushes)
    for url, future, key in writes:
        _result(future, url, "writing")
        if flushes:  # its pages go to disk while the later arrays are written (durable.py)
            durable.start_writeback(os.path.join(work.local_path, key))
    if staged.rank != 0:
        _make_durable(work)


def _result_of(fn: Callable[[], None], url: str, what: str) -> None:
    try:
        fn()
    except Exception as err:
        raise CheckpointError(
            f"{what} {url} failed: {err}; check that the storage is writable and has space"
        ) from err


def _wait(running: list, url: str, quiet: bool = False) -> None:
    """Wait for the transactions in `running` (emptied), raising the first failure unless
    `quiet` (a save that already failed reports its own error)."""
    while running:
        future = running.pop()
        try:
            _result(future, url, "writing")
        except CheckpointError:
            if not quiet:
                raise


def _result(future, url: str, what: str):
    try:
        return future.result()
    except Exception as err:
        raise CheckpointError(
            f"{what} {url} failed: {err}; check that the storage is writable and has space"
        ) from err


def _commit(
    staged: Staged,
    work: storage.Location,
    scalar_arrays: set[str],
    done: tuple[float, bool, Callable[[], None]],
    files: dict[str, str],
    owner: dict | None,
    before_commit: Callable[[], None] | None,
    metrics: dict[str, float] | None = None,
) -> None:
    # when the save began; whether its arrays are in OCDBT; waits until they are written
    started, consolidated, arrays_written = done
    records = [item.record for item in staged.leaves]
    tree_bytes = layout.dump_json(layout.tree_description(records, staged.treedef, staged.step))
    metadata = {layout.TREE_FILE: tree_bytes}
    orbax = orbax_layout.orbax_metadata(records, scalar_arrays, staged.empty_nodes)
    orbax["use_ocdbt"] = consolidated
    metadata[layout.ORBAX_METADATA] = layout.dump_json(orbax)
    strings = {r.key: r.value for r in records if r.kind == "str"}
    if strings:
        metadata[layout.ORBAX_STRINGS] = layout.dump_json(strings)
    now_ns = time.time_ns()
    orbax_step = {
        "item_handlers": "orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
        "PyTreeCheckpointHandler",
        "metrics": dict(metrics or {}),  # where orbax's own managers keep what they rank by
        "performance_metrics": {},
        "init_timestamp_nsecs": int(started * 1e9),
        "commit_timestamp_nsecs": now_ns,
        "custom_metadata": {},
    }
    metadata[layout.ORBAX_CHECKPOINT_METADATA] = layout.dump_json(orbax_step)
    metadata[layout.ORBAX_COMMIT] = f"Checkpoint commit was successful to {work.url}".encode()
    if not work.is_local:
        storage.write_many(work, metadata)
    commit = {
        "format": layout.FORMAT,
        "version": array_store.OCDBT_VERSION if consolidated else 1,
        "step": staged.step,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "world_size": staged.world_size,
        "timestamp": staged.timestamp,
        "tree_blake2b": layout.digest(tree_bytes),
        # Every other metadata file the reader trusts, under the same kind of digest.
        "files": {**files, **{n: layout.digest(d) for n, d in metadata.items()}},
        "writer": owner if owner is not None else _this_process(),
    }
    if consolidated:
        commit["arrays"] = array_store.OCDBT
    if metrics:
        commit["metrics"] = dict(metrics)
    if before_commit is not None:
        before_commit()
    marker = layout.dump_json(commit)
    arrays_written()  # the metadata above was prepared while the arrays were written
    if not work.is_local:
        storage.write_bytes(work, layout.COMMIT_FILE, marker)  # last: the marker commits
        return
    # A local checkpoint is committed by its rename into place (`_move_into_place`), so the marker
    # is written with the other files and one flush makes every file and directory entry below
    # `work` -- this rank's arrays, the marker -- durable before that rename.
    storage.write_many(_unsynced(work), {**metadata, layout.COMMIT_FILE: marker})
    _make_durable(work)


def _this_process() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _move_into_place(work: storage.Location, loc: storage.Location) -> None:
    """Rename the committed `work` directory to `loc`, replacing an older checkpoint there."""
    old = None
    if os.path.exists(loc.local_path):
        old = loc.sibling(loc.name + ".old")
        storage.delete_dir(old)
        storage.rename_dir(loc, old)
    storage.rename_dir(work, loc)
    if old is not None:
        storage.delete_dir(old)


def save(
    path: Any,
    state: Any,
    *,
    overwrite: bool = False,
    storage_options: dict | None = None,
    group=None,
) -> str:
    """Save `state` as a checkpoint directory at `path`, atomically.

    Every rank of `group` calls it together; each writes only its own shards. The call returns
    once the checkpoint is committed.

    Args:
        path: the checkpoint directory: a path, `file://`, `memory://`, `s3://` or `gs://` URL.
        state: a `TrainState` or any pytree of tensors, DTensors and int/float/bool/str leaves.
        overwrite: replace a committed checkpoint already at `path`.
        storage_options: backend options (S3 `endpoint`, `region`, ...).
        group: the process group of the saving ranks (None: the default group).
    Returns:
        the checkpoint's URL.
    Example:
        >>> functrain.checkpoint.save("/tmp/run/step_000000100", state)
        '/tmp/run/step_000000100'
    """
    loc = storage.resolve(path, storage_options)
    return write(stage(state, group=group), loc, group=group, overwrite=overwrite)
