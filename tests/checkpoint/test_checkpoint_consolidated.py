"""The consolidated layout: a small single-rank save keeps every array in one OCDBT database.

Same values, same validation, still readable by orbax; the reader refuses damage to the database
(its data file, its manifest) and a commit marker that misstates the layout.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil

import numpy as np
import pytest
import torch
from ckpt_helpers import blank_like, make_state, same_bits

from functrain import checkpoint
from functrain.checkpoint import array_store, layout
from functrain.checkpoint.errors import CheckpointCorruptError, CheckpointError
from functrain.tree import leaves_with_paths

pytestmark = pytest.mark.usefixtures("consolidated")


def _same_state(loaded, state) -> None:
    got, want = dict(leaves_with_paths(loaded)), dict(leaves_with_paths(state))
    assert got.keys() == want.keys()
    for key, value in want.items():
        if hasattr(value, "dtype"):
            assert same_bits(got[key], value), key
        else:
            assert got[key] == value, key


def _json(path: str, name: str):
    return json.loads(pathlib.Path(path, name).read_text())


@pytest.fixture
def saved(tmp_path):
    state = make_state()
    return checkpoint.save(tmp_path / "c", state), state


def test_a_small_single_rank_save_is_one_database_that_loads_exactly(saved):
    path, state = saved
    names = set(os.listdir(path))
    assert {"manifest.ocdbt", "d", layout.COMMIT_FILE, layout.TREE_FILE} <= names
    assert not any(n.startswith(("params", "opt_state")) for n in names)  # no leaf directories
    files = [f for _, _, fs in os.walk(path) for f in fs]
    tensors = [v for _, v in leaves_with_paths(state) if hasattr(v, "dtype")]
    assert len(files) < len(tensors) // 2  # a manifest, a few data files, the root's metadata
    commit = _json(path, layout.COMMIT_FILE)
    assert commit["arrays"] == "ocdbt" and commit["version"] == array_store.OCDBT_VERSION
    assert _json(path, layout.ORBAX_METADATA)["use_ocdbt"]
    _same_state(checkpoint.load(path, like=blank_like(state)), state)
    flat = checkpoint.load(path)  # without `like`: every leaf whole, as saved
    assert same_bits(flat["params.fc.weight"], state.params["fc.weight"])


def test_orbax_restores_a_consolidated_checkpoint(saved):
    logging.getLogger("absl").setLevel(logging.ERROR)
    ocp = pytest.importorskip("orbax.checkpoint")
    path, state = saved
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)
    restored = ocp.Checkpointer(handler).restore(path)
    np.testing.assert_array_equal(restored["params"]["fc.weight"], state.params["fc.weight"])
    assert restored["step"] == state.step


def test_a_state_over_the_threshold_keeps_a_directory_per_leaf(tmp_path, monkeypatch):
    monkeypatch.setattr(array_store, "CONSOLIDATE_BELOW", 64)
    path = checkpoint.save(tmp_path / "c", make_state())
    assert os.path.isfile(os.path.join(path, "params.fc.weight", layout.ARRAY_METADATA))
    assert not os.path.exists(os.path.join(path, "manifest.ocdbt"))
    assert "arrays" not in _json(path, layout.COMMIT_FILE)


def _data_files(path: str) -> list[str]:
    folder = os.path.join(path, "d")
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder))]


@pytest.mark.parametrize("target", ["data", "manifest"])
def test_a_flipped_byte_anywhere_in_the_database_never_loads_different_values(
    saved, tmp_path, target
):
    # Chunks carry a crc32c, zarr.json files a digest in COMMIT.json, the database's nodes and
    # manifest their own checksums: a flip is an error, or (in bytes of earlier database
    # versions no read reaches) changes nothing -- never silently different values.
    path, state = saved
    name = "manifest.ocdbt" if target == "manifest" else max(_data_files(path), key=os.path.getsize)
    size = os.path.getsize(os.path.join(path, name))
    outcomes = []
    for offset in range(0, size, max(1, size // 40)):
        case = str(tmp_path / f"case_{offset}")
        shutil.copytree(path, case)
        file = pathlib.Path(case, os.path.relpath(os.path.join(path, name), path))
        data = bytearray(file.read_bytes())
        data[offset] ^= 0x55
        file.write_bytes(bytes(data))
        try:
            _same_state(checkpoint.load(case, like=blank_like(state)), state)
            outcomes.append("same")
        except CheckpointCorruptError:
            outcomes.append("refused")
        shutil.rmtree(case)
    assert outcomes.count("refused") > len(outcomes) // 2, outcomes


def test_a_missing_manifest_or_data_file_is_refused(saved, tmp_path):
    path, state = saved
    case = str(tmp_path / "manifest")
    shutil.copytree(path, case)
    os.remove(os.path.join(case, "manifest.ocdbt"))
    with pytest.raises(CheckpointCorruptError, match="missing|corrupt|truncated"):
        checkpoint.load(case, like=blank_like(state))
    # A data file may hold only an earlier version of the database, which nothing reads: its
    # loss changes nothing. Any other is refused; all of them gone certainly is.
    for index, _ in enumerate(_data_files(path)):
        case = str(tmp_path / f"data_{index}")
        shutil.copytree(path, case)
        os.remove(_data_files(case)[index])
        try:
            _same_state(checkpoint.load(case, like=blank_like(state)), state)
        except CheckpointCorruptError:
            pass
    case = str(tmp_path / "no_data")
    shutil.copytree(path, case)
    shutil.rmtree(os.path.join(case, "d"))
    with pytest.raises(CheckpointCorruptError, match="missing|corrupt|truncated"):
        checkpoint.load(case, like=blank_like(state))


def _with_commit(path: str, tmp_path, edit) -> str:
    case = str(tmp_path / "edited")
    shutil.copytree(path, case)
    marker = os.path.join(case, layout.COMMIT_FILE)
    commit = json.loads(pathlib.Path(marker).read_text())
    edit(commit)
    pathlib.Path(marker).write_text(json.dumps(commit))
    return case


def test_a_commit_marker_that_misstates_the_layout_is_refused(saved, tmp_path):
    path, state = saved
    unknown = _with_commit(path, tmp_path, lambda c: c.update(arrays="zip"))
    with pytest.raises(CheckpointCorruptError, match="'arrays'"):
        checkpoint.load(unknown, like=blank_like(state))
    shutil.rmtree(unknown)
    too_old = _with_commit(path, tmp_path, lambda c: c.update(version=1))
    with pytest.raises(CheckpointCorruptError, match="format version 2"):
        checkpoint.load(too_old, like=blank_like(state))
    shutil.rmtree(too_old)
    newer = _with_commit(path, tmp_path, lambda c: c.update(version=layout.VERSION + 1))
    with pytest.raises(CheckpointError, match="upgrade functrain"):
        checkpoint.load(newer, like=blank_like(state))


def test_a_directory_layout_marked_consolidated_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(array_store, "CONSOLIDATE_BELOW", 0)
    state = make_state()
    path = checkpoint.save(tmp_path / "c", state)
    case = _with_commit(path, tmp_path, lambda c: c.update(arrays="ocdbt", version=2))
    with pytest.raises(CheckpointCorruptError):
        checkpoint.load(case, like=blank_like(state))


def test_a_directory_checkpoint_of_format_version_1_still_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(array_store, "CONSOLIDATE_BELOW", 0)
    state = make_state()
    path = checkpoint.save(tmp_path / "c", state)
    assert _json(path, layout.COMMIT_FILE)["version"] == 1
    _same_state(checkpoint.load(path, like=blank_like(state)), state)


def test_overwriting_a_consolidated_checkpoint_in_place_loads_the_new_values(tmp_path):
    # The same directory (and its `.tmp`) holds a new database each time: nothing cached from
    # the previous one may be read back.
    path = str(tmp_path / "c")
    like = {"a": torch.zeros(3, 4), "b": torch.zeros(5)}
    for value in range(4):
        state = {"a": torch.full((3, 4), float(value)), "b": torch.full((5,), float(value))}
        checkpoint.save(path, state, overwrite=True)
        loaded = checkpoint.load(path, like=like)
        assert {float(v.unique()) for v in loaded.values()} == {float(value)}
    assert os.path.isfile(os.path.join(path, "manifest.ocdbt"))
