"""Writing a local checkpoint's chunk files directly: one write per chunk, at disk speed.

The write twin of `local_chunks`. A chunk file of functrain's zarr3 arrays is the chunk's
elements, C order, little-endian (the `bytes` codec), then their crc32c (the `crc32c` codec).
tensorstore computes that checksum in software as it writes (a 96 MB state: 345 ms to write its
arrays, 165 ms without the checksum); google_crc32c computes it with the CPU's instruction. So on
a local disk this rank's chunks are written straight from the staged host data -- a whole chunk
inside the region is handed to `writev` as it lies in memory, its checksum after it, no copy --
by a small pool of threads (the writes release the GIL). A chunk at the padded edge of the array
is written as tensorstore writes it: the full chunk shape, zeros (the fill value) in the padding.
The bytes are tensorstore's, byte for byte (tests/checkpoint/test_checkpoint_local_chunk_writes).

What it does not cover stays with tensorstore: object stores, consolidated (OCDBT) saves, bool
arrays (as on the read side), zero-size arrays, big-endian hosts, and a region that is not made
of whole chunks (ranks would then share a chunk file).

Durability is the writer's, as before: files are written without fsync; with `writeback` each
one is queued for the disk as soon as it is written (`durable.start_file_writeback`), and the
writer's one `durable.sync_tree` makes them durable before the commit.

Example:
    >>> if direct(loc, record, item.region, item.data):
    ...     write_arrays(loc, [(record.key, record.shape, record.chunks, item.region, item.data)])
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Sequence

import google_crc32c
import numpy as np

from . import durable, layout, storage
from .dtypes import numpy_dtype
from .errors import CheckpointStorageError
from .local_chunks import run_bounded

# Chunks written at once: several writes in flight keep a local disk (NVMe) busy; each worker
# holds at most one scratch chunk (edge chunks, chunks not contiguous in the region).
MAX_WORKERS = 8
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

# (key, global shape, chunk shape, region (one slice per dimension, or () for all), data)
Array = tuple[str, Sequence[int], Sequence[int], tuple[slice, ...], np.ndarray]


def direct(
    loc: storage.Location, record: layout.LeafRecord, region: tuple[slice, ...], data: np.ndarray
) -> bool:
    """True when this rank's `data` of leaf `record` (the part `region` of the array) can be
    written by `write_arrays` into the local checkpoint directory `loc`.

    Args:
        loc: the checkpoint directory being written.
        record: the leaf (a tensor, or a 0-d scalar array).
        region: the slices of the array `data` holds (`()`: all of it).
        data: the staged host data.
    Returns:
        whether every chunk the region covers is whole inside it or ends at the array's edge,
        and the dtype, byte order and host are ones the direct path writes exactly.
    """
    if not loc.is_local or record.dtype is None or not plain_bytes(data):
        return False
    shape, chunks = tuple(record.shape or ()), tuple(record.chunks or ())
    if data.size == 0 or 0 in shape or len(chunks) != len(shape):
        return False
    if data.dtype.itemsize != _itemsize(record.dtype):
        return False
    bounds = _bounds(region, shape)
    if bounds is None or tuple(hi - lo for lo, hi in bounds) != data.shape:
        return False
    # Whole chunks only: a chunk shared with another rank's region would need read-modify-write.
    return all(
        lo % c == 0 and (hi % c == 0 or hi == n) for (lo, hi), c, n in zip(bounds, chunks, shape)
    )


def plain_bytes(data: np.ndarray) -> bool:
    """Whether `data`'s own bytes are what zarr3's `bytes` codec writes for it (little-endian):
    a little-endian host, data in native byte order, not bool (tensorstore writes those)."""
    return sys.byteorder == "little" and data.dtype != np.bool_ and data.dtype.byteorder in "=|"


def whole_chunk(data: np.ndarray) -> bytes:
    """The chunk file of an array that is one whole chunk (`plain_bytes(data)`): its elements'
    bytes in C order, then their crc32c.

    Example:
        >>> len(whole_chunk(np.zeros(3, np.float32)))   # 12 bytes of data, 4 of checksum
        16
    """
    body = np.ascontiguousarray(data).tobytes()
    return body + google_crc32c.value(body).to_bytes(4, "little")


def write_arrays(loc: storage.Location, arrays: Sequence[Array], writeback: bool = False) -> None:
    """Write every chunk of the regions `arrays` into the local checkpoint directory `loc`.

    Args:
        loc: the checkpoint directory (local); each array's directory and `c/...` directories
            below it are created as needed (its zarr.json is written by the caller).
        arrays: `(key, shape, chunk shape, region, data)` per array, each accepted by `direct`.
        writeback: queue each file for the disk once written (the save will flush).
    Raises:
        CheckpointStorageError: a directory or file could not be created or written.
    Example:
        >>> write_arrays(loc, [("w", (3,), (3,), (slice(0, 3),), np.ones(3, np.float32))])
    """
    plans, count = [], 0
    for key, shape, chunks, region, data in arrays:
        bounds = _bounds(region, tuple(shape))
        assert bounds is not None  # `direct` accepted it
        data = np.ascontiguousarray(data)
        per_dim = [range(lo // c, -(-hi // c)) for (lo, hi), c in zip(bounds, chunks)]
        base = os.path.join(loc.local_path, key)
        # The `c/i/j/...` directories holding the chunk files (the last index names the file;
        # a 0-d array's one chunk is the file `c`).
        heads = itertools.product(*per_dim[:-1]) if per_dim else [None]
        for head in heads:
            _make_dirs(base if head is None else os.path.join(base, "c", *map(str, head)), loc.url)
        plans.append((base, tuple(chunks), data, bounds, per_dim))
        count += math.prod(len(r) for r in per_dim)
    tasks = (
        (base, chunks, data, bounds, index, writeback, loc.url)
        for base, chunks, data, bounds, per_dim in plans
        for index in itertools.product(*per_dim)
    )
    run_bounded(_write_chunk, tasks, min(count, MAX_WORKERS), "functrain-save")


def _write_chunk(base, chunks, data, bounds, index, writeback, url) -> None:
    """Write chunk `index` of the array in directory `base` from `data` (the region `bounds`):
    its bytes, padded to the full chunk with zeros at the array's edge, then their crc32c."""
    start = [i * c for i, c in zip(index, chunks)]
    box = tuple(slice(s - lo, min(s + c, hi) - lo) for s, c, (lo, hi) in zip(start, chunks, bounds))
    part = data[box] if data.ndim else data.reshape(1)
    full = math.prod(chunks) * data.dtype.itemsize
    # Only the leading dimension may be cut short by the edge: then the chunk is the part's
    # bytes followed by zeros; otherwise the padding interleaves and a scratch chunk is built.
    tail_only = all(b.stop - b.start == c for b, c in zip(box[1:], chunks[1:]))
    if not (part.flags.c_contiguous and tail_only):
        scratch = np.zeros(chunks, data.dtype)
        scratch[tuple(slice(0, b.stop - b.start) for b in box)] = part
        part = scratch
    body = part.reshape(-1).view(np.uint8)
    pad = bytes(full - body.nbytes)
    crc = google_crc32c.value(body)
    if pad:
        crc = google_crc32c.extend(crc, pad)
    name = "/".join(["c", *map(str, index)])
    path = os.path.join(base, name)
    try:
        fd = os.open(path, _FILE_FLAGS, 0o666)
        try:
            _write_all(fd, [memoryview(body), pad, crc.to_bytes(4, "little")])
            if writeback:  # its pages go to disk while the other chunks are written
                durable.start_file_writeback(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise CheckpointStorageError(
            f"{url}: writing chunk {os.path.relpath(path, os.path.dirname(base))} failed: "
            f"{err}; check that the storage is writable and has space, then save again"
        ) from None


def _write_all(fd: int, buffers: list) -> None:
    """`writev` every byte of `buffers` (a call may write fewer bytes than asked)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if views and written:
            views[0] = views[0][written:]


def _make_dirs(path: str, url: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)  # ranks and the metadata writer may race: all fine
    except OSError as err:
        raise CheckpointStorageError(
            f"{url}: creating {path} failed: {err}; check that the storage is writable"
        ) from None


def _bounds(region: tuple[slice, ...], shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """`(start, stop)` per dimension of `region` inside `shape`; None for a region with steps,
    open bounds or bounds outside the array."""
    if not region:
        return [(0, n) for n in shape]
    if len(region) != len(shape):
        return None
    out = []
    for s, n in zip(region, shape):
        if s.step not in (None, 1) or s.start is None or s.stop is None:
            return None
        if not 0 <= s.start < s.stop <= n:
            return None
        out.append((s.start, s.stop))
    return out


def _itemsize(dtype: str) -> int:
    try:
        return numpy_dtype(dtype).itemsize
    except Exception:  # a dtype numpy cannot hold: tensorstore writes it
        return -1


__all__ = ["MAX_WORKERS", "direct", "plain_bytes", "whole_chunk", "write_arrays"]
