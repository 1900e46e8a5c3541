"""Describing a checkpoint: what a committed checkpoint holds, validated before anything is read.

`describe(path)` reads COMMIT.json and tree.json (or orbax's `_METADATA`), checks every metadata
file against the digests COMMIT.json keeps, checks that the step agrees everywhere it is written,
and tells an uncommitted or missing checkpoint apart from a damaged one. `reader.load` reads the
arrays a `Description` names.

Example:
    >>> desc = describe("/tmp/run/step_000000100")
    >>> [record.key for record in desc.records][:2]
    ['params.fc.weight', 'params.fc.bias']
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from . import array_store, layout, local_tree, orbax_layout, storage
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotCommittedError,
    CheckpointNotFoundError,
)

_ORBAX_TMP = ".orbax-checkpoint-tmp"


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
        consolidated: the arrays (and their zarr.json) are in one OCDBT database.
    """

    loc: storage.Location
    records: list[layout.LeafRecord]
    commit: dict | None = None
    orbax: dict | None = None
    files: dict[str, str] | None = None
    consolidated: bool = False

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
        return array_store.array_kvstore(self.loc, record.key, self.consolidated)

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
        local_tree.check_local_tree(os.path.realpath(loc.local_path), loc.url)
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
    consolidated = commit.get("arrays") == array_store.OCDBT
    return Description(loc, records, commit=commit, files=files, consolidated=consolidated)


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
    elif commit.get("arrays", array_store.OCDBT) != array_store.OCDBT:
        problem = f"'arrays' is {layout.summary(commit['arrays'])}, not {array_store.OCDBT!r}"
    elif "arrays" in commit and version < array_store.OCDBT_VERSION:
        problem = f"'arrays' needs format version {array_store.OCDBT_VERSION}, not {version}"
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
        records, flags = orbax_layout.parse_orbax_metadata(
            layout.parse_json(metadata, url, "orbax tree description"), url
        )
        return Description(loc, records, orbax=flags, consolidated=flags["use_ocdbt"])
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


__all__ = ["Description", "check_digest", "describe"]
