"""Reading a local checkpoint's chunk files directly: one read per chunk, at disk speed.

An array functrain writes stores each chunk as one file, `<key>/c/<i>/<j>...`: the chunk's
elements, C order, little-endian (zarr3's `bytes` codec), then their crc32c (the `crc32c` codec).
On a local disk the reader reads such a file straight into the result array, verifies the
checksum over the bytes it just read (no second pass over the disk, no intermediate copy) and
reads many chunks at once on a bounded pool of threads. A chunk only partly inside the region a
rank needs (another mesh's shard, the padded edge of the array) is read whole into a scratch
buffer, verified, and its part copied.

The files are untrusted: no symbolic link is followed at any level below the checkpoint
directory, anything but a regular file is refused, a file whose size is not exactly a chunk and
its checksum is refused before anything is read into memory for it, and a missing chunk is an
error rather than zeros -- as strict as tensorstore's reading, which serves everything else
(object stores, OCDBT, orbax's codecs).

Example:
    >>> if all(direct(loc, meta) for meta in metadata):
    ...     arrays = read_arrays(loc, [("params.w", url, meta, ())])   # [np.ndarray]
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import functools
import itertools
import math
import os
import stat
import sys
from collections.abc import Sequence

import google_crc32c
import numpy as np

from . import storage
from .dtypes import numpy_dtype
from .errors import CheckpointCorruptError, CheckpointError, CheckpointStorageError

# Chunks read at once: local disks (NVMe especially) want several reads in flight, and each
# worker holds at most one scratch chunk, which bounds the memory beyond the results.
MAX_WORKERS = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted in place of a chunk must not block (it is then refused).
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_CRC_BYTES = 4


def direct(loc: storage.Location, metadata: dict) -> bool:
    """True when the validated `metadata` of an array of `loc` can be read by `read_arrays`:
    a local zarr3 array with functrain's codecs (bytes little-endian, then crc32c).

    Bool arrays are left to tensorstore (a byte other than 0 or 1 is no valid torch bool), as
    is every array on a big-endian host.
    """
    if not loc.is_local or sys.byteorder != "little" or metadata.get("zarr_format") != 3:
        return False
    dtype = metadata["data_type"]
    if dtype == "bool":
        return False
    little = {"configuration": {"endian": "little"}, "name": "bytes"}
    codecs = [little if numpy_dtype(dtype).itemsize > 1 else {"name": "bytes"}, {"name": "crc32c"}]
    default_keys = metadata["chunk_key_encoding"] == {"name": "default"}  # c/0/1, "/" between
    return metadata["codecs"] == codecs and default_keys


def read_arrays(
    loc: storage.Location, arrays: Sequence[tuple[str, str, dict, tuple[slice, ...]]]
) -> list[np.ndarray]:
    """Read the regions of several arrays of the local checkpoint `loc`.

    Args:
        loc: the checkpoint directory (local).
        arrays: `(key, url, validated metadata, region)` per array; `region` is one slice per
            dimension with explicit bounds inside the array, or `()` for the whole array.
    Returns:
        one C-contiguous, writable array per entry, of the region's shape and the array's dtype.
    Raises:
        CheckpointCorruptError: a chunk is missing, unsafe, of the wrong size or fails its
            crc32c digest (reason "chunk", or "unsafe" for a link or a special file).
        CheckpointStorageError: the disk failed or refused a read.
    """
    results, plans, count = [], [], 0
    for key, url, meta, region in arrays:
        shape = tuple(meta["shape"])
        chunks = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
        bounds = [(s.start, s.stop) for s in region] if region else [(0, n) for n in shape]
        out = _allocate([hi - lo for lo, hi in bounds], numpy_dtype(meta["data_type"]))
        results.append(out)
        if out.size:
            per_dim = [range(lo // c, (hi - 1) // c + 1) for (lo, hi), c in zip(bounds, chunks)]
            plans.append((key, url, out, bounds, chunks, per_dim))
            count += math.prod(len(r) for r in per_dim)
    if not count:
        return results
    # Chunks are handed out as workers free up: crafted metadata with millions of tiny chunks
    # costs no memory before the first missing one fails the load.
    tasks = (
        (key, url, out, bounds, chunks, index)
        for key, url, out, bounds, chunks, per_dim in plans
        for index in itertools.product(*per_dim)
    )
    step_fd = _open_step(loc)
    try:
        run_bounded(
            functools.partial(_read_chunk, step_fd),
            tasks,
            min(count, MAX_WORKERS),
            "functrain-load",
        )
    finally:
        os.close(step_fd)
    return results


def run_bounded(function, tasks, workers: int, name: str) -> None:
    """`function(*task)` for every task on `workers` threads named `name`, at most two per worker
    queued (a generator of tasks is never listed whole); raise the first failure in order.

    Example:
        >>> run_bounded(print, iter([("a",), ("b",)]), workers=1, name="functrain-load")
        a
        b
    """
    if workers <= 1:
        for task in tasks:
            function(*task)
        return
    with concurrent.futures.ThreadPoolExecutor(workers, name) as pool:
        pending: collections.deque = collections.deque()
        try:
            for task in tasks:
                pending.append(pool.submit(function, *task))
                if len(pending) >= 2 * workers:
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _allocate(shape: list[int], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-order array; an empty one with C strides, as torch gives it (numpy's
    strides of 0 would make torch's `reshape(-1).view(...)` of the tensor fail)."""
    if math.prod(shape):
        return np.empty(shape, dtype)
    strides, step = [], dtype.itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape, strides[::-1])


def _open_step(loc: storage.Location) -> int:
    try:
        return os.open(loc.local_path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise CheckpointStorageError(
            f"cannot open {loc.url}: {err}; check that it exists and is readable"
        ) from None


def _read_chunk(step_fd, key, url, out, bounds, chunks, index) -> None:
    """Read chunk `index` of array `key`, verify its crc32c, and place its part of the region
    `bounds` in `out`."""
    name = "/".join(["c", *map(str, index)])
    itemsize = out.dtype.itemsize
    nbytes = math.prod(chunks) * itemsize
    start = [i * c for i, c in zip(index, chunks)]
    lo = [max(s, b0) for s, (b0, _) in zip(start, bounds)]
    hi = [min(s + c, b1) for s, c, (_, b1) in zip(start, chunks, bounds)]
    target = out[tuple(slice(a - b0, b - b0) for a, b, (b0, _) in zip(lo, hi, bounds))]
    if out.ndim == 0:
        target = out.reshape(1)
    whole = all(a == s and b == s + c for a, b, s, c in zip(lo, hi, start, chunks))
    fd, size = _open_chunk(step_fd, key, name, url)
    try:
        if size != nbytes + _CRC_BYTES:
            raise _corrupt(
                url,
                name,
                f"has {size} bytes, not the {nbytes + _CRC_BYTES} of a chunk of shape "
                f"{list(chunks)} and its checksum: it is truncated or corrupted",
            )
        scratch = not (whole and target.flags.c_contiguous)
        # A whole chunk lands straight in the result; a part of one goes through a scratch
        # buffer, allocated only now that the file's size is known to be a chunk's.
        buffer = np.empty(nbytes, np.uint8) if scratch else target.reshape(-1).view(np.uint8)
        trailer = bytearray(_CRC_BYTES)
        _read_exactly(fd, memoryview(buffer.data), url, name)
        _read_exactly(fd, memoryview(trailer), url, name)
    finally:
        os.close(fd)
    stored, computed = int.from_bytes(trailer, "little"), google_crc32c.value(buffer)
    if stored != computed:
        raise _corrupt(
            url,
            name,
            f"fails its crc32c digest check (stored {stored:#010x}, computed {computed:#010x}): "
            "its bytes changed after they were written",
        )
    if scratch:
        box = tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start))
        values = buffer.view(out.dtype).reshape(chunks)[box]
        np.copyto(target, values if out.ndim else values.reshape(1))


def _open_chunk(step_fd: int, key: str, name: str, url: str) -> tuple[int, int]:
    """Open `key/name` below the checkpoint without following a link at any level; return the
    descriptor of the regular file and its size."""
    parts = [key, *name.split("/")]
    fd = step_fd
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        try:
            child = os.open(part, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
        except OSError as err:
            error = _open_error(url, name, err, _is_link(part, fd))
            if fd != step_fd:
                os.close(fd)
            raise error from None
        if fd != step_fd:
            os.close(fd)
        fd = child
    try:
        info = os.fstat(fd)
    except OSError as err:
        os.close(fd)
        raise _storage(url, name, err) from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise CheckpointCorruptError(
            f"{url}: chunk {name} is not a regular file (a FIFO, socket or device: reading it "
            "could block or read what is not the checkpoint); load another checkpoint",
            reason="unsafe",
        )
    return fd, info.st_size


def _read_exactly(fd: int, view: memoryview, url: str, name: str) -> None:
    got = 0
    try:
        while got < len(view):
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise _corrupt(url, name, "ended early: it is truncated")
            got += n
    except OSError as err:
        raise _storage(url, name, err) from None


def _is_link(part: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(part, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _open_error(url: str, name: str, err: OSError, link: bool) -> CheckpointError:
    # O_NOFOLLOW refuses a link with ELOOP, or ENOTDIR where a directory was asked for.
    if link or err.errno == errno.ELOOP:
        return CheckpointCorruptError(
            f"{url}: {name} (or a directory above it) is a symbolic link; a checkpoint's files "
            "must be regular files (a link could point outside it) -- replace it by the file "
            "itself or load another checkpoint",
            reason="unsafe",
        )
    if isinstance(err, FileNotFoundError):
        return _corrupt(url, name, "is missing (a chunk is never left out)")
    if isinstance(err, NotADirectoryError):
        return _corrupt(url, name, "is missing (a file stands where its directory should be)")
    return _storage(url, name, err)


def _corrupt(url: str, name: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{url}: chunk {name} {what}. The array is missing, truncated or corrupted (checksums "
        "and chunk presence are verified on read); load an earlier checkpoint",
        reason="chunk",
    )


def _storage(url: str, name: str, err: OSError) -> CheckpointStorageError:
    return CheckpointStorageError(
        f"{url}: reading chunk {name} failed: {err}. The storage failed (the checkpoint may be "
        "fine); check that it is reachable and readable, then retry"
    )


__all__ = ["MAX_WORKERS", "direct", "read_arrays", "run_bounded"]
