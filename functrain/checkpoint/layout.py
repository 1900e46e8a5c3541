"""The on-disk layout of a checkpoint: file names, leaf keys, and the JSON files that describe it.

A checkpoint is a directory laid out like orbax-checkpoint's (`use_ocdbt=False, use_zarr3=True`),
so orbax -- and through it JAX -- restores it as numpy arrays:

    <dir>/params.fc.weight/zarr.json   one zarr3 array per tensor (and per scalar, for orbax);
    <dir>/params.fc.weight/c/0/0       chunks, each with a crc32c checksum (zarr3 codec)
    <dir>/_METADATA                    orbax's tree description
    <dir>/_strings.json                orbax's string leaves (only when there are any)
    <dir>/tree.json                    functrain's tree description: every leaf's path, kind,
                                       dtype, global shape, chunk shape, saved placements, value
    <dir>/_CHECKPOINT_METADATA         orbax's step metadata
    <dir>/commit_success.txt           orbax's commit marker
    <dir>/COMMIT.json                  functrain's commit marker, written last: step, time,
                                       world size, timestamp, who wrote it, and the blake2b of
                                       tree.json and of every other metadata file ("files":
                                       each zarr.json, _METADATA, _strings.json, ...)

A small single-rank local save keeps the same zarr.json files and chunks, under the same keys,
in one OCDBT database (`<dir>/manifest.ocdbt`, `<dir>/d/`; orbax's `use_ocdbt=True`), recorded
in COMMIT.json as `"arrays": "ocdbt"` with format version 2 (see `array_store`).

A Manager root holds one such directory per step, `step_000000100` (nine digits), plus:

    <root>/step_000000200.tmp/             a save in flight (local files; renamed when committed)
    <root>/step_000000300.corrupt-<why>/   a damaged checkpoint that auto-resume set aside
                                           (never deleted; `why` is one of `SET_ASIDE_REASONS`,
                                           a `-2`, `-3`, ... suffix when the name is taken)
    <root>/LEASE.json                      the run that owns the root (see `lease`)

A leaf's key is its dotted path (`params.fc.weight`), which names its directory. Keys come from
dict keys the user chose and, on load, from a file that may have been tampered with, so each is
checked to be a single, safe directory name.

Example:
    >>> check_key("params.fc.weight", "saving")
    >>> check_key("../../etc", "loading")
    Traceback (most recent call last):
    ...
    CheckpointCorruptError: ...
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from typing import Any

from .errors import CheckpointCorruptError, CheckpointError

FORMAT = "functrain.checkpoint"
VERSION = 2  # 2: arrays may be consolidated in one OCDBT database (`array_store`)

TREE_FILE = "tree.json"
COMMIT_FILE = "COMMIT.json"
ORBAX_METADATA = "_METADATA"
ORBAX_CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
ORBAX_STRINGS = "_strings.json"
ORBAX_COMMIT = "commit_success.txt"
ARRAY_METADATA = "zarr.json"  # inside each array's directory
LEASE_FILE = "LEASE.json"  # in a Manager root
# The files at a checkpoint's top level that COMMIT.json's digests may name.
ROOT_FILES = {TREE_FILE, ORBAX_METADATA, ORBAX_STRINGS, ORBAX_CHECKPOINT_METADATA, ORBAX_COMMIT}
RESERVED = {
    TREE_FILE,
    COMMIT_FILE,
    ORBAX_METADATA,
    ORBAX_CHECKPOINT_METADATA,
    ORBAX_STRINGS,
    ORBAX_COMMIT,
    "_sharding",
    "d",
    "manifest.ocdbt",
}

SCALAR_KINDS = {"int": int, "float": float, "bool": bool, "str": str}
KINDS = {"tensor", *SCALAR_KINDS}
# orbax key types: 1 = an index into a sequence, 2 = a mapping key (or a named field).
KEY_SEQUENCE, KEY_MAPPING = 1, 2
MAX_KEY_BYTES = 240  # file systems cap a name at 255 bytes; orbax's temporary suffixes need room
# A metadata file larger than this is refused before it is parsed (a tree.json of a model with
# 100k leaves is a few tens of MB).
MAX_JSON_BYTES = 512 * 2**20

STEP_DIR = re.compile(r"^step_(\d+)$")
# Why auto-resume set a checkpoint aside: the suffix of its new name, `step_N.corrupt-<reason>`.
SET_ASIDE_REASONS = ("damaged", "chunk", "metadata", "digest", "commit", "unsafe")
SET_ASIDE = re.compile(r"^step_(\d+)\.corrupt-(" + "|".join(SET_ASIDE_REASONS) + r")(-\d+)?$")


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint of optimizer step `step` in a Manager root."""
    return f"step_{int(step):09d}"


def dir_step(name: str) -> int | None:
    """The step a Manager root's directory name stands for (`step_000000100` -> 100), or None."""
    match = STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def check_key(key: str, where: str, file: str = "") -> None:
    """Raise unless `key` is a safe single directory name.

    Args:
        key: a leaf's dotted path.
        where: "saving" or "loading", which selects the message and the fix.
        file: the description file the key came from (loading), for the message.
    """
    problem = None
    if not isinstance(key, str) or not key:
        problem = "is empty"
    elif key in (".", "..") or key.startswith("/") or "/" in key or "\\" in key or "\0" in key:
        problem = "would escape the checkpoint directory"
    elif key in RESERVED:
        problem = "collides with a file name the checkpoint format reserves"
    elif len(key.encode()) > MAX_KEY_BYTES:
        problem = f"is longer than {MAX_KEY_BYTES} bytes"
    if problem is None:
        return
    if where == "saving":
        raise CheckpointError(
            f"cannot save leaf {key!r}: its dotted path {problem}; rename the dict key(s) that "
            "form it (keys may not contain '/' or '\\', be '.'/'..', or be a reserved file name)"
        )
    raise CheckpointCorruptError(
        f"{file}: leaf path {key!r} {problem}; the tree description is corrupted or was "
        "tampered with -- do not use this checkpoint, load an earlier one"
    )


@dataclasses.dataclass
class LeafRecord:
    """One leaf of a saved tree, as described in tree.json.

    Attributes:
        path: the leaf's path as strings (NamedTuple/dataclass fields by name).
        key_types: orbax's key type per path entry (1 sequence index, 2 mapping key or field).
        kind: "tensor", "int", "float", "bool" or "str".
        value: the value of a scalar leaf.
        dtype: the zarr3 data type of a tensor (`functrain.checkpoint.dtypes`).
        shape: a tensor's global shape.
        chunks: a tensor's zarr chunk shape.
        layout: how a DTensor was placed when saved (`mesh_shape`, `mesh_dim_names`,
            `placements`), for information; loading uses the `like` state's placements.
    """

    path: tuple[str, ...]
    key_types: tuple[int, ...]
    kind: str
    value: Any = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    chunks: tuple[int, ...] | None = None
    layout: dict | None = None

    @functools.cached_property
    def key(self) -> str:
        """The dotted path: the name of the leaf's array directory (a record's path is never
        reassigned, so it is joined once: a save asks for it ~10 times per leaf)."""
        return ".".join(self.path)

    def to_json(self) -> dict:
        out: dict[str, Any] = {"key": self.key, "path": list(self.path)}
        out["key_types"] = list(self.key_types)
        out["kind"] = self.kind
        if self.kind == "tensor":
            out.update(dtype=self.dtype, shape=list(self.shape), chunks=list(self.chunks))
            out["layout"] = self.layout
            out["checksum"] = "crc32c per chunk (zarr3 codec)"
        else:
            out["value"] = self.value
        return out

    @classmethod
    def from_json(cls, item: Any, file: str) -> LeafRecord:
        """Parse and validate one entry of an untrusted tree.json."""

        def bad(why: str) -> CheckpointCorruptError:
            return CheckpointCorruptError(
                f"{file}: invalid leaf entry {summary(item)}: {why}; the tree description is "
                "corrupted -- load an earlier checkpoint",
                reason="metadata",
            )

        if not isinstance(item, dict):
            raise bad("not an object")
        path, key_types, kind = item.get("path"), item.get("key_types"), item.get("kind")
        if not (isinstance(path, list) and path and all(isinstance(p, str) for p in path)):
            raise bad("'path' must be a non-empty list of strings")
        if not (isinstance(key_types, list) and len(key_types) == len(path)):
            raise bad("'key_types' must list one key type per path entry")
        if any(t not in (KEY_SEQUENCE, KEY_MAPPING) for t in key_types):
            raise bad("'key_types' entries must be 1 or 2")
        if kind not in KINDS:
            raise bad(f"'kind' must be one of {sorted(KINDS)}")
        record = cls(path=tuple(path), key_types=tuple(key_types), kind=kind)
        if item.get("key") != record.key:
            raise bad("'key' is not the dotted 'path'")
        check_key(record.key, "loading", file)
        if kind == "tensor":
            shape, chunks, dtype = item.get("shape"), item.get("chunks"), item.get("dtype")
            if not _int_list(shape, 0) or not _int_list(chunks, 1) or len(shape) != len(chunks):
                raise bad("'shape' and 'chunks' must be lists of non-negative ints of one length")
            if not isinstance(dtype, str):
                raise bad("'dtype' must be a string")
            layout = item.get("layout")
            if layout is not None and not _valid_layout(layout):
                raise bad(
                    "'layout' must be null or an object of 'mesh_shape' (ints), "
                    "'mesh_dim_names' (strings or null) and 'placements' (strings)"
                )
            record.dtype, record.shape, record.chunks = dtype, tuple(shape), tuple(chunks)
            record.layout = layout
        else:
            value = item.get("value")
            expected = SCALAR_KINDS[kind]
            if type(value) is not expected and not (expected is float and type(value) is int):
                raise bad(f"'value' must be a {expected.__name__}")
            record.value = expected(value)
        return record


def _valid_layout(value: Any) -> bool:
    """True for a DTensor layout as `staging` writes it (informational; kept flat and small)."""
    if not isinstance(value, dict) or set(value) - {"mesh_shape", "mesh_dim_names", "placements"}:
        return False
    names = value.get("mesh_dim_names")
    placements = value.get("placements")
    return (
        _int_list(value.get("mesh_shape"), 1)
        and (names is None or (isinstance(names, list) and all(isinstance(n, str) for n in names)))
        and isinstance(placements, list)
        and all(isinstance(p, str) and len(p) < 64 for p in placements)
    )


def summary(value: Any, limit: int = 200) -> str:
    """A short text of an untrusted JSON value that never recurses (`str` of a deeply nested
    object raises RecursionError)."""
    if isinstance(value, dict):
        text = "{" + ", ".join(repr(k)[:40] for k in list(value)[:8]) + (", ...}" if value else "}")
    elif isinstance(value, list):
        text = f"[... {len(value)} items]"
    else:
        text = repr(value)
    return text[:limit]


def _int_list(value: Any, minimum: int) -> bool:
    return isinstance(value, list) and all(
        type(v) is int and v >= minimum
        for v in value  # bools are not sizes
    )


def dump_json(obj: Any) -> bytes:
    """Compact, deterministic JSON bytes (NaN/inf floats allowed, as Python's json writes them)."""
    return json.dumps(obj, sort_keys=False, separators=(",", ":")).encode()


def parse_json(data: bytes, file: str, what: str) -> Any:
    """Parse JSON from an untrusted file, naming the file and the fix on failure."""
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointCorruptError(
            f"{file}: the {what} is {len(data)} bytes, more than any checkpoint writes "
            f"({MAX_JSON_BYTES}); it is corrupted -- load an earlier checkpoint",
            reason="metadata",
        )
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorruptError(
            f"{file}: the {what} is truncated or corrupted ({err}); load an earlier checkpoint",
            reason="metadata",
        ) from None
    except RecursionError:
        raise CheckpointCorruptError(
            f"{file}: the {what} is nested too deeply to be a checkpoint's description; it is "
            "corrupted or crafted -- load an earlier checkpoint",
            reason="metadata",
        ) from None


def digest(data: bytes) -> str:
    """The blake2b-128 hex digest that COMMIT.json records for tree.json and the other files."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def array_metadata_file(key: str) -> str:
    """The name, relative to the checkpoint directory, of a leaf array's zarr.json."""
    return f"{key}/{ARRAY_METADATA}"


def tree_description(records: list[LeafRecord], treedef: str, step: int | None) -> dict:
    """The content of tree.json."""
    return {
        "format": FORMAT,
        "version": 1,  # the tree's own format is unchanged since version 1
        "step": step,
        "treedef": treedef,
        "leaves": [r.to_json() for r in records],
    }


def parse_tree_description(obj: Any, file: str) -> list[LeafRecord]:
    """Validate tree.json's content and return its leaf records (in saved order)."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointCorruptError(
            f"{file} is not a functrain tree description (no format {FORMAT!r}); load an earlier "
            "checkpoint"
        )
    if not isinstance(obj.get("version"), int) or obj["version"] > VERSION:
        raise CheckpointError(
            f"{file} has format version {obj.get('version')!r}, newer than this functrain "
            f"understands ({VERSION}); upgrade functrain to load it"
        )
    leaves = obj.get("leaves")
    if not isinstance(leaves, list):
        raise CheckpointCorruptError(f"{file}: 'leaves' must be a list; load an earlier checkpoint")
    records = [LeafRecord.from_json(item, file) for item in leaves]
    seen: set[str] = set()
    for r in records:
        if r.key in seen:
            raise CheckpointCorruptError(f"{file}: leaf {r.key!r} appears twice; load another one")
        seen.add(r.key)
    return records
