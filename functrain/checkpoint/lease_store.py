"""Where a lease record lives, with the compare-and-swap a lease needs: `LocalStore` (a file
under an exclusive `flock` of the root) and `ObjectStore` (tensorstore's conditional writes).

Both `read()` a record with a version, and `swap(data, expected)` writes (or, with None,
deletes) it only when it is still at that version.

Example:
    >>> store = LocalStore(resolve("/runs/a"))
    >>> data, version = store.read()
    >>> store.swap(b'{"format": "functrain.lease", ...}', version)
    True
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import threading
from typing import Any

from . import layout, local_tree, storage
from .storage import Location, kvstore

MAX_RECORD_BYTES = 1 << 16  # a lease record is a few hundred bytes


class LocalStore:
    """LEASE.json on a local (or mounted) file system.

    Creating it is atomic on its own (`link` fails when the name exists); replacing or deleting
    it happens under an exclusive `flock` of the root directory, so that reading, comparing and
    swapping is one step for every process of the machine (and on network file systems whose
    locks work). No lock file is left behind.
    """

    def __init__(self, root: storage.Location):
        self.dir = root.local_path
        self.path = os.path.join(self.dir, layout.LEASE_FILE)

    def read(self) -> tuple[bytes | None, Any]:
        # Not followed if a link, refused unless a regular file (a FIFO would block forever).
        data = local_tree.read_local_file(self.path, self.path, MAX_RECORD_BYTES)
        return data, data

    def swap(self, data: bytes | None, expected: Any) -> bool:
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # no locks here: creation stays atomic, a take-over is best effort
                pass
            current, _ = self.read()
            if current != expected:
                return False
            if data is None:
                os.remove(self.path)
                return True
            tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.partial"
            try:  # the partial file is removed however the write ends (a full disk, say)
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if expected is None:
                    try:
                        os.link(tmp, self.path)  # fails if another run created it meanwhile
                    except FileExistsError:
                        return False
                else:
                    os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            storage.fsync_dir(self.dir)
            return True
        finally:
            os.close(fd)  # releases the flock


class ObjectStore:
    """LEASE.json as an object, swapped with tensorstore's conditional writes."""

    def __init__(self, root: storage.Location):
        kvstore = dict(root.kvstore)
        if root.scheme == "s3":
            kvstore.setdefault("use_conditional_write", True)
        self.loc = dataclasses.replace(root, kvstore=kvstore)

    def read(self) -> tuple[bytes | None, bytes]:
        return read_versioned(self.loc, layout.LEASE_FILE)

    def swap(self, data: bytes | None, expected: bytes) -> bool:
        return write_if(self.loc, layout.LEASE_FILE, data, expected) is not None


def read_versioned(loc: Location, name: str) -> tuple[bytes | None, bytes]:
    """`(content or None, generation)` of an object, for a later `write_if` (object stores)."""
    result = kvstore(loc).read(name).result()
    value = bytes(result.value) if result.state == "value" else None
    return value, result.stamp.generation


def write_if(loc: Location, name: str, data: bytes | None, generation: bytes) -> bytes | None:
    """Write (or delete, `data=None`) an object only if it is still at `generation` (from
    `read_versioned`; that of a missing object means "only if absent").

    Returns:
        the new generation, or None when the object changed in between (nothing written).
    """
    result = kvstore(loc).write(name, data, if_equal=generation).result()
    return result.generation or None


__all__ = ["LocalStore", "ObjectStore", "read_versioned", "write_if"]
