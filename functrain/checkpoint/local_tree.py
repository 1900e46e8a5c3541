"""A local checkpoint's files, walked and opened as the untrusted input they are.

A symlink could point anywhere (outside the checkpoint, at a device), a FIFO blocks a read
forever and a socket or device file is not data: the walk refuses each, naming the entry, so
that a crafted or damaged directory fails with `CheckpointCorruptError` instead of hanging or
reading what it should not. `read_local_file` opens one file the same way (no symlink followed,
nothing but a regular file read, at most a given size).

Example:
    >>> check_local_tree("/runs/a/step_000000100", "file:///runs/a/step_000000100")
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import CheckpointCorruptError, CheckpointStorageError


def check_local_tree(path: str, url: str) -> None:
    """Refuse a local checkpoint directory holding anything but regular files and directories.

    A symlink could make the reader load values from outside the checkpoint (or from a device),
    and a FIFO or socket makes a read block forever, so none is followed: the walk uses the
    directory entries' own types (`lstat`), never what they point to.

    Raises:
        CheckpointCorruptError: naming the entry.
    """
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except NotADirectoryError:
            raise _unsafe(url, current, path, "is not a directory") from None
        except FileNotFoundError:
            continue  # vanished while walking (a concurrent clean-up); reading will say so
        for entry in entries:
            if entry.is_symlink():
                raise _unsafe(url, entry.path, path, "is a symbolic link")
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                kind = _kind(entry.path)
                raise _unsafe(url, entry.path, path, f"is a {kind}, not a regular file")


def _kind(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "special file"
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def _unsafe(url: str, entry: str, root: str, what: str) -> CheckpointCorruptError:
    rel = os.path.relpath(entry, root)
    return CheckpointCorruptError(
        f"{url}: {rel} {what}; a checkpoint holds only regular files and directories, so "
        "nothing outside it is read and no read can block -- this one was tampered with or "
        "assembled by hand: copy real files in its place (cp -L) or load an earlier checkpoint",
        reason="unsafe",
    )


def read_local_file(path: str, url: str, limit: int) -> bytes | None:
    """The content of the regular file `path` (None when missing), at most `limit` bytes.

    Raises:
        CheckpointCorruptError: a symlink, a special file or a file over `limit` bytes.
        CheckpointStorageError: the disk failed.
    """
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        )
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise CheckpointCorruptError(
                f"{url} is a symbolic link; a checkpoint's files must be regular files (a link "
                "could point outside it) -- replace it by the file itself or load another one",
                reason="unsafe",
            ) from None
        raise CheckpointStorageError(f"cannot open {url}: {err}; check its permissions") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointCorruptError(
                f"{url} is not a regular file (a FIFO, socket or device: reading it could block "
                "or read what is not the checkpoint); load another checkpoint",
                reason="unsafe",
            )
        if info.st_size > limit:
            raise too_large(url, limit)
        chunks, size = [], 0
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            size += len(block)
            if size > limit:  # it grew while being read
                raise too_large(url, limit)
            chunks.append(block)
        return b"".join(chunks)
    except OSError as err:
        raise CheckpointStorageError(f"reading {url} failed: {err}; check the disk") from None
    finally:
        os.close(fd)


def too_large(url: str, limit: int) -> CheckpointCorruptError:
    """The error for a metadata file over `limit` bytes."""
    return CheckpointCorruptError(
        f"{url} is larger than {limit} bytes, more than any checkpoint metadata file; it is "
        "corrupted or crafted -- load an earlier checkpoint",
        reason="metadata",
    )


__all__ = ["check_local_tree", "read_local_file", "too_large"]
