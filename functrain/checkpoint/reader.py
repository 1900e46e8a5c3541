"""Loading: read a checkpoint into the structure, mesh and placements of a `like` state.

`load(path, like=state)` rebuilds `like`'s pytree leaf by leaf. Each tensor leaf is read from its
zarr3 array: a plain tensor whole, a DTensor only the box its own placements give this rank, so a
checkpoint saved on any mesh loads on any other. Every chunk's crc32c is checked as it is read, and
a missing chunk is an error rather than zeros. Checkpoints written by orbax-checkpoint (numpy
arrays, with or without OCDBT) load the same way.

The files are untrusted input: they are parsed as JSON and zarr metadata only (no pickle, nothing
executes), leaf paths are checked not to escape the directory, and every mismatch with `like`
raises an error that names the file and the fix.

Example:
    >>> state = load("/tmp/run/step_000000100", like=state)
    >>> weights = load("/tmp/run/step_000000100")          # {dotted key: value}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import optree
import tensorstore as ts
import torch

from . import layout, storage, verify
from .dtypes import TORCH_DTYPES, from_numpy, torch_dtype, zarr_name
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotCommittedError,
    CheckpointNotFoundError,
    CheckpointStorageError,
)
from .sharding import dtensor_from_local, is_dtensor
from .staging import leaf_paths

WEIGHT_FIELDS = ("params", "buffers")
_ORBAX_TMP = ".orbax-checkpoint-tmp"
MAX_ARRAY_METADATA_BYTES = 2**20  # a zarr.json is a few hundred bytes


@dataclasses.dataclass
class Description:
    """What a committed checkpoint holds.

    Attributes:
        loc: the checkpoint directory.
        records: one `LeafRecord` per leaf, in saved order.
        commit: the content of COMMIT.json (None for orbax checkpoints).
        orbax: orbax's flags (`use_ocdbt`, `use_zarr3`) for checkpoints written by orbax; None
            for functrain checkpoints.
        files: the digests COMMIT.json keeps for the metadata files (None when it keeps none:
            orbax checkpoints, and functrain's before it recorded them).
    """

    loc: storage.Location
    records: list[layout.LeafRecord]
    commit: dict | None = None
    orbax: dict | None = None
    files: dict[str, str] | None = None

    def array_spec(self, record: layout.LeafRecord, metadata: dict) -> dict:
        """The tensorstore spec that opens a leaf's array for reading, with its validated
        metadata (tensorstore is told to assume it rather than read zarr.json itself)."""
        driver = "zarr3" if metadata["zarr_format"] == 3 else "zarr"
        return {
            "driver": driver,
            "kvstore": self._array_kvstore(record),
            "metadata": metadata,
            "fill_missing_data_reads": False,
        }

    def _array_kvstore(self, record: layout.LeafRecord) -> dict:
        if self.orbax is not None and self.orbax["use_ocdbt"]:
            return {"driver": "ocdbt", "base": self.loc.kvstore, "path": record.key + "/"}
        return self.loc.child(record.key).kvstore

    def metadata_file(self, record: layout.LeafRecord) -> str:
        """The name of a leaf's array metadata file (zarr3 `zarr.json`, zarr2 `.zarray`)."""
        zarr3 = self.orbax is None or self.orbax["use_zarr3"]
        return f"{record.key}/{layout.ARRAY_METADATA if zarr3 else '.zarray'}"


def describe(path: Any, storage_options: dict | None = None) -> Description:
    """Read and validate the description of the committed checkpoint at `path`.

    Validates, before any array is opened: on local disks, that the directory holds only
    regular files and directories; that COMMIT.json, tree.json and every other metadata file
    match the digests COMMIT.json keeps; and that the step in COMMIT.json, in tree.json and in
    the directory's name (`step_000000100`) agree.

    Args:
        path: a checkpoint directory (path or URL, see `storage.resolve`).
        storage_options: backend options (S3 endpoint, region, ...).
    Returns:
        its `Description`.
    Raises:
        CheckpointNotFoundError, CheckpointNotCommittedError, CheckpointCorruptError.
    """
    loc = storage.resolve(path, storage_options)
    if loc.is_local and os.path.isdir(loc.local_path):
        verify.check_local_tree(os.path.realpath(loc.local_path), loc.url)
    commit_bytes = storage.read_bytes(loc, layout.COMMIT_FILE)
    if commit_bytes is None:
        return _describe_uncommitted(loc)
    commit_url = loc.file_url(layout.COMMIT_FILE)
    commit = _parse_commit(layout.parse_json(commit_bytes, commit_url, "commit marker"), commit_url)
    tree_url = loc.file_url(layout.TREE_FILE)
    tree_bytes = storage.read_bytes(loc, layout.TREE_FILE)
    if tree_bytes is None:
        raise CheckpointCorruptError(
            f"{tree_url} is missing although the checkpoint is committed; files were deleted "
            "from it -- load an earlier checkpoint",
            reason="metadata",
        )
    if commit.get("tree_blake2b") != layout.digest(tree_bytes):
        raise CheckpointCorruptError(
            f"{tree_url} does not match the checksum in {layout.COMMIT_FILE} (it was truncated "
            "or modified after the commit); load an earlier checkpoint",
            reason="digest",
        )
    tree = layout.parse_json(tree_bytes, tree_url, "tree description")
    records = layout.parse_tree_description(tree, tree_url)
    _check_steps(loc, commit, tree, records)
    files = commit.get("files")
    if files is not None:
        # Every array COMMIT.json lists is a leaf of tree.json: one missing from the tree means
        # the two disagree, and loading without `like` would silently drop it. (A leaf whose
        # zarr.json is not listed fails its digest check when it is read.)
        known = {layout.array_metadata_file(r.key) for r in records}
        stray = sorted(
            n for n in files if n.endswith("/" + layout.ARRAY_METADATA) and n not in known
        )
        if stray:
            raise CheckpointCorruptError(
                f"{layout.COMMIT_FILE} lists the array {layout.summary(stray[0])}"
                f"{' (and more)' if len(stray) > 1 else ''}, which {tree_url} does not have: the "
                "checkpoint was modified after the commit -- load an earlier checkpoint",
                reason="metadata",
            )
        # The root's other metadata files (zarr.json files are checked as each array is read).
        names = [n for n in files if "/" not in n and n != layout.TREE_FILE]
        for name, data in storage.read_many(loc, names).items():
            check_digest(loc, name, data, files)
    return Description(loc, records, commit=commit, files=files)


def _parse_commit(commit: Any, url: str) -> dict:
    if not isinstance(commit, dict) or commit.get("format") != layout.FORMAT:
        raise CheckpointCorruptError(
            f"{url} is not a functrain commit marker; load an earlier checkpoint", reason="commit"
        )
    version = commit.get("version")
    if type(version) is not int:
        raise CheckpointCorruptError(
            f"{url} has no format version; load an earlier checkpoint", reason="commit"
        )
    if version > layout.VERSION:
        raise CheckpointError(
            f"{url} has format version {version}, newer than this functrain understands "
            f"({layout.VERSION}); upgrade functrain to load it"
        )
    step, files = commit.get("step"), commit.get("files")
    problem = None
    if step is not None and (type(step) is not int or step < 0):
        problem = "'step' is not a non-negative int"
    elif not isinstance(commit.get("tree_blake2b"), str):
        problem = "'tree_blake2b' is not a digest"
    elif files is not None and not (
        isinstance(files, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ):
        problem = "'files' is not a map of file names to digests"
    elif commit.get("timestamp") is not None and not isinstance(commit["timestamp"], dict):
        problem = "'timestamp' is not an object"
    if problem:
        raise CheckpointCorruptError(
            f"{url}: {problem}; load an earlier checkpoint", reason="commit"
        )
    for name in files or ():  # names become paths: only a leaf's zarr.json or a root file
        key, nested, rest = name.partition("/")
        if nested and rest == layout.ARRAY_METADATA:
            layout.check_key(key, "loading", url)
        elif nested or name not in layout.ROOT_FILES:
            raise CheckpointCorruptError(
                f"{url}: 'files' lists {layout.summary(name)}, not a checkpoint metadata file; "
                "load an earlier checkpoint",
                reason="commit",
            )
    return commit


def _check_steps(loc: storage.Location, commit: dict, tree: dict, records: list) -> None:
    """COMMIT.json's step, tree.json's, the state's `step` leaf and the directory name agree."""
    seen = {f"{layout.COMMIT_FILE} says": commit.get("step")}
    seen[f"{layout.TREE_FILE} says"] = tree.get("step")
    leaf = next((r for r in records if r.path == ("step",) and r.kind == "int"), None)
    if leaf is not None and commit.get("step") is not None:
        seen["the state's step leaf holds"] = leaf.value
    named = layout.dir_step(loc.name)
    if named is not None:
        seen[f"the directory name {loc.name!r} says"] = named
    values = {v for v in seen.values()}
    if len(values) > 1:
        told = "; ".join(f"{who} {value}" for who, value in seen.items())
        raise CheckpointCorruptError(
            f"{loc.url}: the checkpoint's step is inconsistent ({told}); it was renamed or "
            "modified, and resuming it would restart from the wrong step -- load an earlier "
            "checkpoint, or rename the directory after the step it holds",
            reason="commit",
        )


def check_digest(loc: storage.Location, name: str, data: bytes | None, files: dict) -> None:
    """Raise unless the metadata file `name` exists and matches COMMIT.json's digest of it."""
    url = loc.file_url(name)
    if data is None:
        raise CheckpointCorruptError(
            f"{url} is missing although {layout.COMMIT_FILE} lists it; files were deleted from "
            "the checkpoint -- load an earlier one",
            reason="metadata",
        )
    expected = files.get(name)
    if expected is None or expected != layout.digest(data):
        what = "is not listed in" if expected is None else "does not match the checksum in"
        raise CheckpointCorruptError(
            f"{url} {what} {layout.COMMIT_FILE} (it was modified after the commit); load an "
            "earlier checkpoint",
            reason="digest",
        )


def _describe_uncommitted(loc: storage.Location) -> Description:
    metadata = storage.read_bytes(loc, layout.ORBAX_METADATA)
    has_tree = storage.exists(loc, layout.TREE_FILE)
    orbax_done = storage.exists(loc, layout.ORBAX_COMMIT) or storage.exists(
        loc, layout.ORBAX_CHECKPOINT_METADATA
    )
    if metadata is not None and not has_tree and orbax_done and _ORBAX_TMP not in loc.url:
        url = loc.file_url(layout.ORBAX_METADATA)
        records, flags = layout.parse_orbax_metadata(
            layout.parse_json(metadata, url, "orbax tree description"), url
        )
        return Description(loc, records, orbax=flags)
    if has_tree or metadata is not None or _has_files(loc):
        raise CheckpointNotCommittedError(
            f"{loc.url} has no {layout.COMMIT_FILE}: its save did not finish (it was interrupted, "
            "or an asynchronous save is still running). Load an earlier checkpoint -- "
            "functrain.checkpoint.latest(root) and Manager.latest() skip uncommitted ones -- or "
            "call Manager.wait() before loading"
        )
    hint = ""
    if any(d.startswith("step_") for d in storage.list_dirs(loc)):
        hint = (
            "; it looks like a Manager root: load functrain.checkpoint.latest(root) or use "
            "Manager(root).restore(like)"
        )
    raise CheckpointNotFoundError(f"no checkpoint at {loc.url}{hint}")


def _has_files(loc: storage.Location) -> bool:
    if loc.is_local:
        try:
            return any(e.is_file() for e in os.scandir(loc.local_path))
        except (FileNotFoundError, NotADirectoryError):
            return False
    return any("/" not in k for k in storage.list_keys(loc))


def _patterns(ignore: str | Iterable[str]) -> tuple[str, ...]:
    patterns = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"ignore must be glob strings such as 'params.head.*', got {ignore!r}")
    return patterns


def _wanted(path: tuple[str, ...], patterns: tuple[str, ...], weights_only: bool) -> bool:
    """False for a leaf `load` must leave alone (ignored by a glob, or not a weight)."""
    if weights_only and path[0] not in WEIGHT_FIELDS:
        return False
    key = ".".join(path)
    # A pattern names a leaf or, as a prefix, a whole subtree: "opt_state" ignores all of it.
    return not any(
        fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(key, p + ".*") for p in patterns
    )


def load(
    path: Any,
    like: Any = None,
    *,
    strict: bool = True,
    ignore: str | Iterable[str] = (),
    weights_only: bool = False,
    inplace: bool = False,
    storage_options: dict | None = None,
) -> Any:
    """Load the checkpoint at `path` into the structure, devices and placements of `like`.

    Args:
        path: a checkpoint directory: a path, `file://`, `memory://`, `s3://` or `gs://` URL.
        like: a state (or one of meta tensors / DTensors: its abstract shape) whose structure,
            shapes, dtypes, devices and placements the result takes. None returns
            `{dotted key: value}` with every tensor whole on the CPU.
        strict: error when `like` has keys the checkpoint lacks or the other way round. With
            False, missing keys keep `like`'s values and unknown ones are skipped.
        ignore: glob patterns of dotted keys (`"params.head.*"`, or a prefix such as
            `"opt_state"`) that keep `like`'s values and are not checked.
        weights_only: load only `params` and `buffers` (a fine-tune from another run's weights);
            everything else keeps `like`'s values.
        inplace: copy loaded tensors into `like`'s tensors (which the model may share) instead of
            returning new ones.
        storage_options: backend options (S3 endpoint, region, ...).
    Returns:
        a pytree like `like` holding the checkpoint's values.
    Raises:
        CheckpointError (and subclasses) naming the file and the fix for every problem.
    Example:
        >>> state = load("s3://bucket/run/step_000001000", like=state, ignore=("opt_state",))
    """
    desc = describe(path, storage_options)
    patterns = _patterns(ignore)
    by_path = {r.path: r for r in desc.records}
    if like is None:
        wanted = [r for r in desc.records if _wanted(r.path, patterns, weights_only)]
        values = _read_all(desc, [(r.key, None, r) for r in wanted], inplace=False)
        return {r.key: values[r.key] for r in wanted}
    leaves, paths, _, treedef = leaf_paths(like)
    wanted_paths = [_wanted(p, patterns, weights_only) for p in paths]
    missing = [".".join(p) for p, w in zip(paths, wanted_paths) if w and p not in by_path]
    known = set(paths)
    unknown = [
        r.key
        for r in desc.records
        if r.path not in known and _wanted(r.path, patterns, weights_only)
    ]
    if strict and (missing or unknown):
        raise CheckpointMismatchError(_mismatch_message(desc.loc.url, missing, unknown))
    jobs = [
        (i, leaf, by_path[p])
        for i, (leaf, p, w) in enumerate(zip(leaves, paths, wanted_paths))
        if w and p in by_path
    ]
    values = _read_all(desc, jobs, inplace=inplace)
    return optree.tree_unflatten(treedef, [values.get(i, leaf) for i, leaf in enumerate(leaves)])


def _mismatch_message(url: str, missing: list[str], unknown: list[str]) -> str:
    def names(keys: list[str]) -> str:
        shown = ", ".join(repr(k) for k in keys[:12])
        return shown + (f", ... ({len(keys) - 12} more)" if len(keys) > 12 else "")

    parts = []
    if missing:
        parts.append(
            f"{len(missing)} key(s) of `like` missing from the checkpoint: {names(missing)}"
        )
    if unknown:
        parts.append(f"{len(unknown)} key(s) of the checkpoint unknown to `like`: {names(unknown)}")
    return (
        f"checkpoint {url} does not match `like`: {'; '.join(parts)}. Fix: build `like` from the "
        "same model and optimizer; or pass ignore=('params.head.*', ...) to skip keys, "
        "weights_only=True to load only params/buffers, or strict=False to keep `like`'s values "
        "for missing keys and drop unknown ones"
    )


def _read_all(desc: Description, jobs: list, *, inplace: bool) -> dict:
    """Read every job `(id, like_leaf, record)`; return `{id: value}`."""
    values: dict = {}
    arrays, problems = [], []  # arrays: (job_id, like_leaf, record, url) of the leaves to read
    for job_id, like_leaf, record in jobs:
        url = desc.loc.file_url(record.key)
        if record.kind != "tensor":
            if isinstance(like_leaf, torch.Tensor):
                raise CheckpointMismatchError(
                    f"{url}: leaf {record.key!r} is a scalar in the checkpoint but a tensor in "
                    "`like`; build `like` from the same state definition or "
                    f"ignore=({record.key!r},)"
                )
            if record.kind != "scalar-array":  # the value is in tree.json
                values[job_id] = (
                    record.value if like_leaf is None else _scalar_value(record, like_leaf, url)
                )
                continue
            if like_leaf is not None:
                _like_scalar_kind(like_leaf, record)
        elif like_leaf is not None:
            if not isinstance(like_leaf, torch.Tensor):
                _like_scalar_kind(like_leaf, record)
                raise CheckpointMismatchError(
                    f"{url}: leaf {record.key!r} is a tensor in the checkpoint but a "
                    f"{type(like_leaf).__name__} in `like`; build `like` from the same state "
                    f"definition or ignore=({record.key!r},)"
                )
            if record.dtype is not None:
                try:
                    _check_fits(record, record.dtype, record.shape, like_leaf, url)
                except CheckpointMismatchError as err:
                    problems.append(str(err))  # report every misfit at once
                    continue
        arrays.append((job_id, like_leaf, record, url))
    _raise_misfits(problems)
    metadata = _array_metadata(desc, [record for _, _, record, _ in arrays])
    for _, like_leaf, record, url in arrays:  # orbax arrays: only now are shapes known
        dtype, shape = verify.metadata_dtype_shape(metadata[record.key])
        if isinstance(like_leaf, torch.Tensor):
            try:
                _check_fits(record, dtype, shape, like_leaf, url)
            except CheckpointMismatchError as err:
                problems.append(str(err))
    _raise_misfits(problems)
    # Without `like` the files decide what is allocated: refuse what cannot be, up front.
    whole = [
        (url, *verify.metadata_dtype_shape(metadata[record.key]))
        for _, like_leaf, record, url in arrays
        if like_leaf is None
    ]
    if whole:
        verify.check_fits_in_memory(whole)
    opening = []
    for job_id, like_leaf, record, url in arrays:
        spec = desc.array_spec(record, metadata[record.key])
        future = ts.open(spec, open=True, assume_metadata=True, context=storage.CONTEXT)
        opening.append((job_id, like_leaf, record, url, future))
    reading = []
    for job_id, like_leaf, record, url, future in opening:
        array = _array(future, url)
        region = _region(like_leaf, record.key) if isinstance(like_leaf, torch.Tensor) else ()
        dtype, _ = verify.metadata_dtype_shape(metadata[record.key])
        reading.append((job_id, like_leaf, record, url, dtype, array[region].read()))
    for job_id, like_leaf, record, url, dtype, future in reading:
        data = _array(future, url)
        if record.kind == "scalar-array":
            values[job_id] = _python_scalar(data, like_leaf, record, url)
            continue
        values[job_id] = _to_tensor(data, dtype, like_leaf, inplace, url)
    return values


def _raise_misfits(problems: list[str]) -> None:
    if not problems:
        return
    shown = "\n  ".join(problems[:10])
    more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
    noun = "leaf does" if len(problems) == 1 else "leaves do"
    raise CheckpointMismatchError(f"{len(problems)} {noun} not fit `like`:\n  {shown}{more}")


def _array_metadata(desc: Description, records: list[layout.LeafRecord]) -> dict[str, dict]:
    """`{key: validated metadata}` of the arrays of `records`, read and checked by functrain
    (digest, codecs, shapes and bounds) before tensorstore is given any of it."""
    names = [desc.metadata_file(r) for r in records]
    if desc.orbax is not None and desc.orbax["use_ocdbt"]:
        raw = _read_ocdbt(desc, names)
    else:
        raw = storage.read_many(desc.loc, names, max_bytes=MAX_ARRAY_METADATA_BYTES)
    out = {}
    for record, name in zip(records, names):
        url = desc.loc.file_url(name)
        data = raw[name]
        if desc.files is not None:
            check_digest(desc.loc, name, data, desc.files)
        if data is None:
            raise CheckpointCorruptError(
                f"{url} is missing; the array was deleted or never written -- load an earlier "
                "checkpoint",
                reason="metadata",
            )
        parsed = layout.parse_json(data, url, "array metadata")
        array_url = desc.loc.file_url(record.key)
        if name.endswith(".zarray"):
            out[record.key] = verify.check_zarr2_metadata(parsed, array_url, record)
        else:
            out[record.key] = verify.check_array_metadata(
                parsed, array_url, record, orbax=desc.orbax is not None
            )
    return out


def _read_ocdbt(desc: Description, names: list[str]) -> dict[str, bytes | None]:
    """Read array metadata from an orbax OCDBT database (tensorstore parses its index)."""
    spec = {"driver": "ocdbt", "base": desc.loc.kvstore}
    try:
        store = ts.KvStore.open(spec, context=storage.CONTEXT).result()
        results = [(n, store.read(n)) for n in names]
        out = {}
        for name, future in results:
            result = future.result()
            value = bytes(result.value) if result.state == "value" else None
            if value is not None and len(value) > MAX_ARRAY_METADATA_BYTES:
                value = b""  # refused by the JSON parser as truncated
            out[name] = value
        return out
    except Exception as err:
        raise _read_error(desc.loc.url, err, "the OCDBT database") from None


def _array(future, url: str):
    try:
        return future.result()
    except Exception as err:
        raise _read_error(url, err, "the array") from None


def _read_error(url: str, err: Exception, what: str) -> CheckpointError:
    if verify.storage_failure(str(err)):
        return CheckpointStorageError(
            f"{url}: {err}. The storage failed while reading {what} (the checkpoint may be "
            "fine); check that it is reachable and readable, then retry"
        )
    return CheckpointCorruptError(
        f"{url}: {err}. {what[0].upper()}{what[1:]} is missing, truncated or corrupted "
        "(checksums and chunk presence are verified on read); load an earlier checkpoint",
        reason="chunk",
    )


def _check_fits(record, dtype: str, shape, like_leaf: torch.Tensor, url: str) -> None:
    want_shape = tuple(like_leaf.shape)
    if tuple(shape) != want_shape:
        raise CheckpointMismatchError(
            f"{url}: leaf {record.key!r} has shape {list(shape)} in the checkpoint but "
            f"{list(want_shape)} in `like`; build `like` with the checkpoint's shapes (the same "
            f"model config), or pass ignore=({record.key!r},) to keep `like`'s value"
        )
    want = zarr_name(like_leaf.dtype, f"`like` leaf {record.key!r}")
    if dtype != want:
        raise CheckpointMismatchError(
            f"{url}: leaf {record.key!r} is {dtype} in the checkpoint but {want} in `like`; "
            f"cast `like` to {TORCH_DTYPES.get(dtype, dtype)} "
            f"before loading, or pass ignore=({record.key!r},)"
        )


def _region(like_leaf: torch.Tensor, key: str) -> tuple[slice, ...]:
    """The box of the global array this rank needs for `like_leaf`."""
    if not is_dtensor(like_leaf):
        return ()
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(isinstance(p, Partial) for p in like_leaf.placements):
        raise CheckpointMismatchError(
            f"`like` leaf {key!r} has a Partial placement, which has no single value to load into; "
            "give `like` Shard/Replicate placements"
        )
    shape, offset = compute_local_shape_and_global_offset(
        like_leaf.shape, like_leaf.device_mesh, like_leaf.placements
    )
    if not offset:  # this rank is outside the tensor's mesh
        return tuple(slice(0, 0) for _ in like_leaf.shape)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def _to_tensor(data: np.ndarray, dtype: str, like_leaf, inplace: bool, url: str) -> torch.Tensor:
    if not data.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d arrays into 1-d)
        data = data.copy(order="C")
    tensor = from_numpy(data, torch_dtype(dtype, url))
    if like_leaf is None:
        return tensor
    target = like_leaf.to_local() if is_dtensor(like_leaf) else like_leaf
    if inplace and target.device.type != "meta":
        with torch.no_grad():
            target.copy_(tensor)
        return like_leaf
    device = target.device
    if device.type == "meta":
        device = torch.device(like_leaf.device_mesh.device_type if is_dtensor(like_leaf) else "cpu")
    tensor = tensor.to(device)
    if device.type == "cpu" and target.is_pinned():  # an offloaded shard stays page-locked
        tensor = tensor.pin_memory()
    if target.requires_grad:
        tensor.requires_grad_(True)
    return dtensor_from_local(tensor, like_leaf) if is_dtensor(like_leaf) else tensor


def _like_scalar_kind(like_leaf, record) -> str:
    kind = _scalar_kind(like_leaf)
    if kind is None:
        raise CheckpointError(
            f"`like` leaf {record.key!r} is a {type(like_leaf).__name__}; `like` may hold only "
            "tensors, DTensors and int/float/bool/str leaves"
        )
    return kind


def _scalar_value(record, like_leaf, url: str) -> Any:
    """The value of a scalar leaf held in tree.json, as the kind `like_leaf` has."""
    kind = _like_scalar_kind(like_leaf, record)
    if record.kind == kind or (kind == "float" and record.kind == "int"):
        return layout.SCALAR_KINDS[kind](record.value)
    raise CheckpointMismatchError(
        f"{url}: leaf {record.key!r} is a {record.kind} in the checkpoint but a {kind} in "
        f"`like`; build `like` from the same state definition or ignore=({record.key!r},)"
    )


def _scalar_kind(value) -> str | None:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    return None


def _python_scalar(data: np.ndarray, like_leaf, record, url: str):
    if data.shape != ():
        raise CheckpointMismatchError(
            f"{url}: leaf {record.key!r} is an array of shape {list(data.shape)}, not a scalar"
        )
    value = data.item()
    kind = _scalar_kind(like_leaf) if like_leaf is not None else _scalar_kind(value)
    return layout.SCALAR_KINDS[kind](value) if kind else value
