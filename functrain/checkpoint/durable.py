"""Durability by one sync per checkpoint: write every file unsynced, then flush them all at once.

A checkpoint is many files (a zarr array per leaf, chunk files, metadata). fsyncing each as it is
written costs a disk flush per file: a 100-leaf state paid ~230 flushes, 40x `torch.save`+fsync.
The guarantee needs only that every file is durable before the commit marker is written, so the
writer writes them all without syncing and then calls `sync_tree` once: `syncfs(2)` on Linux
(flushes the file system holding the directory -- data, inodes and directory entries -- and, since
Linux 5.8, reports a failed writeback as an error), elsewhere an fsync of every file and then of
every directory below it. The commit marker itself is then written and fsynced on its own.

That one flush would start writing the whole checkpoint only once the last byte is written; so as
each array is written the writer calls `start_writeback` on its files (Linux `sync_file_range`:
queue the pages for the disk, do not wait), and the flush finds most of them already on disk. A
hint only: what makes the files durable is still `sync_tree`.

Example:
    >>> sync_tree("/tmp/run/step_000000100.tmp")   # every file below it is now durable
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys

from .errors import CheckpointError


def sync_tree(path: str) -> None:
    """Make every file and directory entry below the local directory `path` durable.

    Args:
        path: a directory whose files were written without fsync.
    Raises:
        CheckpointError: the flush failed (an I/O error: the data may not be on disk).
    Example:
        >>> sync_tree("/tmp/run/step_000000100.tmp")
    """
    if not os.path.isdir(path):  # this rank wrote nothing (its shards are all replicas)
        return
    if sys.platform.startswith("linux") and _syncfs(path):
        return
    _fsync_each(path)


def start_writeback(path: str) -> None:
    """Start writing every file below the local directory `path` to disk, without waiting.

    Args:
        path: a directory (a leaf's array) whose files were just written without fsync.
    Example:
        >>> start_writeback("/tmp/run/step_000000100.tmp/params.w")
    """
    call = _libc_function("sync_file_range")
    if call is None or not os.path.isdir(path):
        return
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:  # gone or unreadable: the flush that follows reports real errors
                continue
            try:
                call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
            finally:
                os.close(fd)


def start_file_writeback(fd: int) -> None:
    """Start writing the file open as `fd` to disk, without waiting (a hint, as above).

    Args:
        fd: a descriptor of a file just written without fsync.
    Example:
        >>> start_file_writeback(fd)
    """
    call = _libc_function("sync_file_range")
    if call is not None:
        call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait


@functools.cache
def _libc_function(name: str):
    """libc's `name` (Linux only), or None where this platform lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    if name == "sync_file_range":
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


def _syncfs(path: str) -> bool:
    """syncfs(2) on the file system of `path`; False where the call is unavailable."""
    syncfs = _libc_function("syncfs")
    if syncfs is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs(fd) == 0:
            return True
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL):  # unsupported here: fall back to fsyncs
            return False
        raise CheckpointError(
            f"flushing {path} to disk failed: {os.strerror(code)}; check the disk (space, I/O "
            "errors) and save again"
        )
    finally:
        os.close(fd)


def _fsync_each(path: str) -> None:
    """fsync every regular file below `path`, then every directory (deepest first)."""
    folders = []
    for dirpath, _, files in os.walk(path):
        folders.append(dirpath)
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for folder in reversed(folders):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.EBADF):  # directories unsyncable here
                raise
        finally:
            os.close(fd)
