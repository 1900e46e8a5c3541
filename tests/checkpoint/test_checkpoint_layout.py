"""The on-disk layout: key safety, tree descriptions, and interop with orbax-checkpoint."""

from __future__ import annotations

import json
import logging

import ml_dtypes
import numpy as np
import pytest
import torch
from ckpt_helpers import make_state, same_bits

import functrain
from functrain import checkpoint
from functrain.checkpoint import layout
from functrain.checkpoint.errors import CheckpointCorruptError, CheckpointError


@pytest.mark.parametrize("key", ["params.fc.weight", "opt_state.0.mu.x", "a..b", ".hidden", "é.ü"])
def test_safe_keys_pass(key):
    layout.check_key(key, "loading", "tree.json")
    layout.check_key(key, "saving")


@pytest.mark.parametrize(
    "key", ["", ".", "..", "/abs", "a/../b", "a\\b", "nul\0", "_METADATA", "x" * 241]
)
def test_unsafe_keys_fail_on_save_and_load(key):
    with pytest.raises(CheckpointError, match="rename the dict key"):
        layout.check_key(key, "saving")
    with pytest.raises(CheckpointCorruptError, match="tree.json: leaf path .* earlier one"):
        layout.check_key(key, "loading", "tree.json")


def test_record_json_round_trip_and_validation():
    record = layout.LeafRecord(
        ("params", "w"), (2, 2), "tensor", dtype="bfloat16", shape=(4, 2), chunks=(2, 2)
    )
    assert layout.LeafRecord.from_json(record.to_json(), "f") == record
    scalar = layout.LeafRecord(("step",), (2,), "int", value=3)
    assert layout.LeafRecord.from_json(scalar.to_json(), "f") == scalar
    bad = dict(scalar.to_json(), value="3")
    with pytest.raises(CheckpointCorruptError, match="'value' must be a int"):
        layout.LeafRecord.from_json(bad, "f")
    with pytest.raises(CheckpointCorruptError, match="'key' is not the dotted 'path'"):
        layout.LeafRecord.from_json(dict(scalar.to_json(), key="other"), "f")
    with pytest.raises(CheckpointError, match="newer than this functrain"):
        layout.parse_tree_description({"format": layout.FORMAT, "version": 99, "leaves": []}, "f")


# -- orbax-checkpoint interop -----------------------------------------------------------------


@pytest.fixture(scope="module")
def ocp():
    logging.getLogger("absl").setLevel(logging.ERROR)
    return pytest.importorskip("orbax.checkpoint")


def test_orbax_restores_a_functrain_checkpoint_as_numpy(tmp_path, ocp):
    state = make_state()
    path = checkpoint.save(tmp_path / "ft", state)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=True)
    restored = ocp.Checkpointer(handler).restore(path)
    weight = restored["params"]["fc.weight"]
    assert isinstance(weight, np.ndarray)
    np.testing.assert_array_equal(weight, state.params["fc.weight"].numpy())
    assert len(restored["opt_state"]) == 3  # the stateless middle transform is kept as empty
    mu = restored["opt_state"][0]["mu"]["head.bias"]  # a tuple of NamedTuples -> list of dicts
    np.testing.assert_array_equal(mu, state.opt_state[0].mu["head.bias"].numpy())
    bf16 = restored["extra"]["mixed"]["bf16"]
    assert bf16.dtype == ml_dtypes.bfloat16
    assert same_bits(
        torch.from_numpy(bf16.view(np.int16)).view(torch.bfloat16), state.extra["mixed"]["bf16"]
    )
    assert restored["step"] == state.step and restored["rng"]["counter"] == 4
    assert restored["extra"]["callbacks"]["early_stop"]["monitor"] == "loss"


def _orbax_tree(state: functrain.TrainState) -> dict:
    """A numpy tree as a JAX program would save it: weights, a step and a data position."""
    return {
        "params": {k: v.numpy().copy() for k, v in state.params.items()},
        "buffers": {k: v.numpy().copy() for k, v in state.buffers.items()},
        "step": 42,
        "extra": {"data": {"position": 77}},
    }


@pytest.mark.parametrize("use_ocdbt, use_zarr3", [(False, True), (True, False)])
def test_an_orbax_checkpoint_loads_into_a_functrain_state(tmp_path, ocp, use_ocdbt, use_zarr3):
    source = make_state(seed=2)
    tree = _orbax_tree(source)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
    ocp.Checkpointer(handler).save(tmp_path / "orbax", args=ocp.args.PyTreeSave(tree))
    like = make_state(seed=5)
    loaded = checkpoint.load(tmp_path / "orbax", like=like, weights_only=True)
    for name, value in source.params.items():
        assert same_bits(loaded.params[name], value), name
    assert same_bits(
        loaded.buffers["bn.num_batches_tracked"], source.buffers["bn.num_batches_tracked"]
    )
    assert loaded.step == like.step  # weights only
    # A `like` that names exactly the orbax tree's leaves loads scalars too.
    subset = {"params": dict(like.params), "step": 0, "extra": {"data": {"position": 0}}}
    loaded = checkpoint.load(tmp_path / "orbax", like=subset, ignore=("buffers",))
    assert loaded["step"] == 42 and loaded["extra"]["data"]["position"] == 77
    flat = checkpoint.load(tmp_path / "orbax")
    assert flat["step"] == 42 and same_bits(flat["params.fc.bias"], source.params["fc.bias"])


def test_orbax_checkpoint_shape_mismatch_is_explained(tmp_path, ocp):
    tree = {"params": {"w": np.zeros((3, 2), np.float32)}}
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=True)).save(
        tmp_path / "o", args=ocp.args.PyTreeSave(tree)
    )
    with pytest.raises(
        checkpoint.CheckpointMismatchError, match=r"shape \[3, 2\] in the checkpoint but \[2, 3\]"
    ):
        checkpoint.load(tmp_path / "o", like={"params": {"w": torch.zeros(2, 3)}})
    loaded = checkpoint.load(tmp_path / "o", like={"params": {"w": torch.ones(3, 2)}})
    assert loaded["params"]["w"].abs().sum() == 0


def test_an_ocdbt_array_the_metadata_names_but_the_database_lacks_is_named(tmp_path, ocp):
    # orbax's _METADATA lists a leaf that its OCDBT database does not hold (a damaged save)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=False)
    ocp.Checkpointer(handler).save(
        tmp_path / "orbax", args=ocp.args.PyTreeSave(_orbax_tree(make_state(seed=2)))
    )
    path = tmp_path / "orbax" / "_METADATA"
    meta = json.loads(path.read_text())
    name = next(k for k in meta["tree_metadata"] if "fc.bias" in k)
    ghost = json.dumps(meta["tree_metadata"][name]).replace("fc.bias", "ghost")
    meta["tree_metadata"][name.replace("fc.bias", "ghost")] = json.loads(ghost)
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorruptError, match=r"params\.ghost/\.zarray is missing"):
        checkpoint.load(tmp_path / "orbax")
