"""Loading: read a checkpoint into the structure, mesh and placements of a `like` state.

`load(path, like=state)` rebuilds `like`'s pytree leaf by leaf. Each tensor leaf is read from its
zarr3 array: a plain tensor whole, a DTensor only the box its own placements give this rank, so a
checkpoint saved on any mesh loads on any other. Every chunk's crc32c is checked as it is read, and
a missing chunk is an error rather than zeros. On a local disk functrain's own arrays are read
directly, many chunks at once, each straight into the result (`local_chunks`); tensorstore reads
the rest. Checkpoints written by orbax-checkpoint (numpy arrays, with or without OCDBT) load the
same way.

The files are untrusted input: they are parsed as JSON and zarr metadata only (no pickle, nothing
executes), leaf paths are checked not to escape the directory, and every mismatch with `like`
raises an error that names the file and the fix.

Example:
    >>> state = load("/tmp/run/step_000000100", like=state)
    >>> weights = load("/tmp/run/step_000000100")          # {dotted key: value}
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

import optree
import tensorstore as ts
import torch

from . import array_store, layout, local_chunks, memory, storage, verify
from .description import Description, check_digest, describe
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointStorageError,
)
from .leaves import (
    check_fits,
    like_scalar_kind,
    python_scalar,
    region_for,
    scalar_value,
    to_tensor,
)
from .structure import leaf_paths

WEIGHT_FIELDS = ("params", "buffers")
MAX_ARRAY_METADATA_BYTES = 2**20  # a zarr.json is a few hundred bytes


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
                    record.value if like_leaf is None else scalar_value(record, like_leaf, url)
                )
                continue
            if like_leaf is not None:
                like_scalar_kind(like_leaf, record)
        elif like_leaf is not None:
            if not isinstance(like_leaf, torch.Tensor):
                like_scalar_kind(like_leaf, record)
                raise CheckpointMismatchError(
                    f"{url}: leaf {record.key!r} is a tensor in the checkpoint but a "
                    f"{type(like_leaf).__name__} in `like`; build `like` from the same state "
                    f"definition or ignore=({record.key!r},)"
                )
            if record.dtype is not None:
                try:
                    check_fits(record, record.dtype, record.shape, like_leaf, url)
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
                check_fits(record, dtype, shape, like_leaf, url)
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
        memory.check_fits_in_memory(whole)
    regions = [
        region_for(like_leaf, record.key) if isinstance(like_leaf, torch.Tensor) else ()
        for _, like_leaf, record, _ in arrays
    ]
    # Local arrays in functrain's own format are read directly (local_chunks); tensorstore
    # reads the rest (object stores, OCDBT, orbax's codecs), concurrently with them.
    direct = [
        not desc.consolidated and local_chunks.direct(desc.loc, metadata[record.key])
        for _, _, record, _ in arrays
    ]
    opening = {
        i: ts.open(
            desc.array_spec(record, metadata[record.key]),
            open=True,
            assume_metadata=True,
            context=storage.CONTEXT,
        )
        for i, (_, _, record, _) in enumerate(arrays)
        if not direct[i]
    }
    reading = {i: _array(future, arrays[i][3])[regions[i]].read() for i, future in opening.items()}
    fast = [i for i in range(len(arrays)) if direct[i]]
    read = local_chunks.read_arrays(
        desc.loc,
        [(arrays[i][2].key, arrays[i][3], metadata[arrays[i][2].key], regions[i]) for i in fast],
    )
    loaded = dict(zip(fast, read))
    for i, (job_id, like_leaf, record, url) in enumerate(arrays):
        data = loaded[i] if direct[i] else _array(reading[i], url)
        if record.kind == "scalar-array":
            values[job_id] = python_scalar(data, like_leaf, record, url)
            continue
        dtype, _ = verify.metadata_dtype_shape(metadata[record.key])
        values[job_id] = to_tensor(data, dtype, like_leaf, inplace, url)
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
    if desc.consolidated:
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
    """Read array metadata from an OCDBT database (tensorstore parses its index)."""
    try:
        return array_store.read_files(desc.loc, names, MAX_ARRAY_METADATA_BYTES)
    except Exception as err:
        raise _read_error(desc.loc.url, err, "the OCDBT database") from None


def _array(future, url: str):
    try:
        return future.result()
    except Exception as err:
        raise _read_error(url, err, "the array") from None


def _read_error(url: str, err: Exception, what: str) -> CheckpointError:
    if storage_failure(str(err)):
        return CheckpointStorageError(
            f"{url}: {err}. The storage failed while reading {what} (the checkpoint may be "
            "fine); check that it is reachable and readable, then retry"
        )
    return CheckpointCorruptError(
        f"{url}: {err}. {what[0].upper()}{what[1:]} is missing, truncated or corrupted "
        "(checksums and chunk presence are verified on read); load an earlier checkpoint",
        reason="chunk",
    )


def storage_failure(message: str) -> bool:
    """True when a tensorstore error is the storage failing (retry later), not bad data."""
    transient = (
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "RESOURCE_EXHAUSTED",
        "CANCELLED",
        "ABORTED",
    )
    return message.split(":", 1)[0].strip() in transient
