"""Where checkpoints live: a path or URL resolved to a tensorstore kvstore.

`resolve` turns a plain path, `file://`, `memory://`, `s3://` or `gs://` URL into a `Location`: a
directory with a tensorstore kvstore spec. The small JSON files of a checkpoint and its zarr arrays
go through the same kvstore, so one code path serves local disks and object stores. Local
directories also get real renames (the atomic commit of a checkpoint) and fsyncs.

S3-compatible stores take the endpoint and region from `storage_options` or the environment
(`FUNCTRAIN_S3_ENDPOINT`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`; `AWS_REGION`,
`AWS_DEFAULT_REGION`); credentials come from the usual `AWS_*` variables.

Example:
    >>> loc = resolve("s3://bucket/runs/a", {"endpoint": "http://127.0.0.1:9000"})
    >>> loc.child("step_000000010").kvstore["path"]
    'runs/a/step_000000010/'
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import stat
import threading
from typing import Any
from urllib.parse import urlparse

import tensorstore as ts

from . import layout, local_tree
from .errors import CheckpointStorageError

# One context for every functrain tensorstore: `memory://` stores live as long as it does (a fresh
# context per call would hand each call an empty memory store), and caches and I/O concurrency
# limits are shared rather than multiplied. Local chunks are read through mmap: the page cache is
# checksummed and copied into the result once, with no intermediate read buffer (25% faster).
CONTEXT = ts.Context(
    {
        "file_io_concurrency": {"limit": max(8, os.cpu_count() or 1)},
        "data_copy_concurrency": {"limit": max(2, os.cpu_count() or 1)},
        "file_io_mode": {"mode": "memmap"},
    }
)

SCHEMES = ("file", "memory", "s3", "gs")

_S3_ENDPOINT_VARS = ("FUNCTRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_S3_REGION_VARS = ("AWS_REGION", "AWS_DEFAULT_REGION")


@dataclasses.dataclass(frozen=True)
class Location:
    """A directory of a storage backend.

    Attributes:
        url: the directory as a URL (a plain absolute path for local files).
        scheme: "file", "memory", "s3" or "gs".
        kvstore: the tensorstore kvstore spec of the directory (its "path" ends with "/").
        fsync: local files only: make every file durable (fsync) before the checkpoint commits.
    """

    url: str
    scheme: str
    kvstore: dict[str, Any]
    fsync: bool = True

    @property
    def is_local(self) -> bool:
        """True for a directory on a local (or mounted) file system."""
        return self.scheme == "file"

    @property
    def local_path(self) -> str:
        """The directory's file-system path (local locations only)."""
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local directory")
        return self.kvstore["path"].rstrip("/") or "/"

    @property
    def name(self) -> str:
        """The last component of the directory's path."""
        return self.kvstore["path"].rstrip("/").rsplit("/", 1)[-1]

    def child(self, name: str) -> Location:
        """The subdirectory `name` (a single path component)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a single directory name")
        path = self.kvstore["path"] + name + "/"
        url = self.url.rstrip("/") + "/" + name
        kvstore = {**self.kvstore, "path": path}
        return Location(url=url, scheme=self.scheme, kvstore=kvstore, fsync=self.fsync)

    @property
    def parent(self) -> Location:
        """The directory that holds this one."""
        parent_path = self.kvstore["path"].rstrip("/").rsplit("/", 1)[0] + "/"
        parent_url = self.url.rstrip("/").rsplit("/", 1)[0]
        kvstore = {**self.kvstore, "path": parent_path}
        return Location(parent_url, self.scheme, kvstore, self.fsync)

    def sibling(self, name: str) -> Location:
        """The directory `name` next to this one."""
        return self.parent.child(name)

    def file_url(self, name: str) -> str:
        """The URL of the file (or zarr array directory) `name` inside this directory."""
        return self.url.rstrip("/") + "/" + name


def resolve(url: str | os.PathLike | Location, storage_options: dict | None = None) -> Location:
    """Resolve a path or URL to a `Location`.

    Args:
        url: a local path, or `file://`, `memory://`, `s3://bucket/prefix`, `gs://bucket/prefix`.
        storage_options: backend options. Local files: `fsync` (default True; False trades
            durability across power loss for speed -- a killed process still never leaves a
            committed partial checkpoint). S3: `endpoint` (e.g. "http://127.0.0.1:9000"),
            `region`, and any other member of tensorstore's s3 kvstore spec; GCS: members of
            tensorstore's gcs kvstore spec.
    Returns:
        the directory's `Location`.
    Example:
        >>> resolve("memory://runs/a").kvstore
        {'driver': 'memory', 'path': 'runs/a/'}
    """
    if isinstance(url, Location):
        return url
    text = os.fspath(url)
    options = dict(storage_options or {})
    if "://" not in text:
        return _local(os.path.abspath(os.path.expanduser(text)), options)
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file:// URL needs an absolute path, as in file:///runs/a")
        return _local(os.path.abspath(parsed.path), options)
    if scheme == "memory":
        _no_options(text, options)
        path = (parsed.netloc + parsed.path).strip("/")
        kvstore = {"driver": "memory", "path": path + "/" if path else ""}
        return Location(url=f"memory://{path}", scheme="memory", kvstore=kvstore)
    if scheme in ("s3", "gs", "gcs"):
        bucket, path = parsed.netloc, parsed.path.strip("/")
        if not bucket:
            raise ValueError(f"{text}: the URL names no bucket; write {scheme}://BUCKET/PREFIX")
        kvstore = {"driver": "s3" if scheme == "s3" else "gcs", "bucket": bucket}
        kvstore["path"] = path + "/" if path else ""
        kvstore.update(_s3_options(options) if scheme == "s3" else options)
        name = "s3" if scheme == "s3" else "gs"
        return Location(url=f"{name}://{bucket}/{path}".rstrip("/"), scheme=name, kvstore=kvstore)
    raise ValueError(
        f"unsupported storage URL {text!r}: use a local path, file://, memory://, s3:// or gs://"
    )


def _local(path: str, options: dict) -> Location:
    fsync = options.pop("fsync", True)
    if not isinstance(fsync, bool):
        raise ValueError(f"storage_options['fsync'] must be True or False, got {fsync!r}")
    _no_options(path, options)
    kvstore: dict[str, Any] = {"driver": "file", "path": path.rstrip("/") + "/"}
    if not fsync:  # tensorstore's file driver fsyncs every chunk unless told otherwise
        kvstore["context"] = {"file_io_sync": False}
    return Location(url=path, scheme="file", kvstore=kvstore, fsync=fsync)


def _no_options(url: str, options: dict) -> None:
    if options:
        raise ValueError(
            f"storage_options {sorted(options)} do not apply to {url}; local paths take only "
            "'fsync', the others are for s3:// and gs://"
        )


def _s3_options(options: dict) -> dict:
    out = dict(options)
    if "region" in out:
        out["aws_region"] = out.pop("region")
    if "endpoint_url" in out:
        out["endpoint"] = out.pop("endpoint_url")
    if "endpoint" not in out:
        for var in _S3_ENDPOINT_VARS:
            if os.environ.get(var):
                out["endpoint"] = os.environ[var]
                break
    if "aws_region" not in out:
        for var in _S3_REGION_VARS:
            if os.environ.get(var):
                out["aws_region"] = os.environ[var]
                break
    return out


_KVSTORES: dict[str, ts.KvStore] = {}
_KVSTORES_LOCK = threading.Lock()


def kvstore(loc: Location) -> ts.KvStore:
    """The opened tensorstore kvstore of `loc` (cached per spec)."""
    key = json.dumps(loc.kvstore, sort_keys=True)
    with _KVSTORES_LOCK:
        store = _KVSTORES.get(key)
    if store is None:
        store = ts.KvStore.open(loc.kvstore, context=CONTEXT).result()
        with _KVSTORES_LOCK:
            _KVSTORES[key] = store
    return store


def read_bytes(loc: Location, name: str, max_bytes: int | None = None) -> bytes | None:
    """The content of the file `name` in `loc`, or None when it does not exist.

    Checkpoint files are untrusted: on local disks a symlink is not followed and anything but
    a regular file (a FIFO would block the read forever) is refused; a file longer than
    `max_bytes` (default `layout.MAX_JSON_BYTES`) is refused before it is read.

    Raises:
        CheckpointCorruptError: an unsafe or oversized file.
        CheckpointStorageError: the storage failed (permissions, I/O errors, unreachable).
    """
    limit = layout.MAX_JSON_BYTES if max_bytes is None else max_bytes
    url = loc.file_url(name)
    if loc.is_local:
        return local_tree.read_local_file(os.path.join(loc.local_path, name), url, limit)
    try:
        # (tensorstore's byte ranges must lie inside the object, so they cannot cap the read:
        # an oversized object is read, then refused.)
        result = kvstore(loc).read(name).result()
    except Exception as err:
        raise CheckpointStorageError(
            f"reading {url} failed: {err}; check that the storage is reachable and readable, "
            "then retry"
        ) from None
    if result.state != "value":
        return None
    if len(result.value) > limit:
        raise local_tree.too_large(url, limit)
    return bytes(result.value)


def read_many(loc: Location, names: list[str], max_bytes: int | None = None) -> dict:
    """`{name: bytes or None}` of several files of `loc`, read concurrently on object stores."""
    if loc.is_local or len(names) < 2:
        return {name: read_bytes(loc, name, max_bytes) for name in names}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
        return dict(zip(names, pool.map(lambda n: read_bytes(loc, n, max_bytes), names)))


def exists(loc: Location, name: str) -> bool:
    """True when the file `name` exists in `loc` (locally: the entry itself, links not followed)."""
    if loc.is_local:
        try:
            return not stat.S_ISDIR(os.lstat(os.path.join(loc.local_path, name)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
    return read_bytes(loc, name) is not None


def write_bytes(loc: Location, name: str, data: bytes) -> None:
    """Write the file `name` in `loc` whole (local files: temporary file, fsync, rename)."""
    if loc.is_local:
        os.makedirs(loc.local_path, exist_ok=True)
        final = os.path.join(loc.local_path, name)
        tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.partial"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if loc.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        return
    kvstore(loc).write(name, data).result()


def write_many(loc: Location, files: dict[str, bytes]) -> None:
    """Write several files of `loc` (concurrently on object stores); names may hold one '/'
    level of directories (`params.w/zarr.json`). Local files are written in place (the
    checkpoint directory is renamed as a whole when committed) and fsynced."""
    if loc.is_local:
        made = set()
        for name, data in files.items():
            path = os.path.join(loc.local_path, name)
            folder = os.path.dirname(path)
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            with open(path, "wb") as f:
                f.write(data)
                if loc.fsync:
                    f.flush()
                    os.fsync(f.fileno())
        if loc.fsync:
            for folder in made:
                fsync_dir(folder)
        return
    store = kvstore(loc)
    for future in [store.write(name, data) for name, data in files.items()]:
        future.result()


def list_keys(loc: Location) -> list[str]:
    """Every file below `loc`, as paths relative to it."""
    if loc.is_local:
        root = loc.local_path
        out: list[str] = []
        for dirpath, _, files in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            out.extend(f if rel == "." else f"{rel}/{f}" for f in files)
        return out
    return [k.decode() for k in kvstore(loc).list().result()]


def list_dirs(loc: Location) -> list[str]:
    """The names of the subdirectories directly inside `loc`."""
    if loc.is_local:
        try:
            # Links are not followed: a symlinked step directory is not part of the root.
            return [e.name for e in os.scandir(loc.local_path) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
    return sorted({k.split("/", 1)[0] for k in list_keys(loc) if "/" in k})


def delete_file(loc: Location, name: str) -> None:
    """Delete the file `name` in `loc` (no error when it is absent)."""
    if loc.is_local:
        try:
            os.remove(os.path.join(loc.local_path, name))
        except FileNotFoundError:
            pass
        return
    kvstore(loc).delete_range(ts.KvStore.KeyRange(name, name + "\0")).result()


def delete_dir(loc: Location) -> None:
    """Delete `loc` and everything below it (no error when it is absent)."""
    if loc.is_local:
        shutil.rmtree(loc.local_path, ignore_errors=True)
        return
    kvstore(loc).delete_range(ts.KvStore.KeyRange()).result()


def make_dir(loc: Location) -> None:
    """Create `loc` (local only; object stores have no directories)."""
    if loc.is_local:
        os.makedirs(loc.local_path, exist_ok=True)


def copy_dir(src: Location, dst: Location) -> None:
    """Copy every object below `src` to `dst` (object stores have no rename)."""
    keys = list_keys(src)
    source, target = kvstore(src), kvstore(dst)
    for start in range(0, len(keys), 64):
        batch = keys[start : start + 64]
        reads = [(key, source.read(key)) for key in batch]
        writes: list[Any] = []  # the write futures (tensorstore's, typed apart from reads')
        for key, future in reads:
            result = future.result()
            if result.state == "value":
                writes.append(target.write(key, result.value))
        for future in writes:
            future.result()


def rename_dir(src: Location, dst: Location) -> None:
    """Atomically rename a local directory and make the rename durable."""
    os.rename(src.local_path, dst.local_path)
    if dst.fsync:
        fsync_dir(os.path.dirname(dst.local_path))


def fsync_dir(path: str) -> None:
    """Make the entries of directory `path` durable (best effort where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
