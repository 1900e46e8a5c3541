"""Loading: round trips of a real TrainState, load options, and every kind of bad input."""

from __future__ import annotations

import ast
import json
import os
import pathlib

import pytest
import torch
from ckpt_helpers import Net, assert_same_state, blank_like, make_state, same_bits

import functrain
from functrain import checkpoint
from functrain.checkpoint import layout
from functrain.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotCommittedError,
    CheckpointNotFoundError,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved state shared by the read-only tests of this module."""
    state = make_state()
    path = str(tmp_path_factory.mktemp("reader") / "ckpt")
    checkpoint.save(path, state)
    return path, state


@pytest.fixture
def fresh(tmp_path):
    """A checkpoint a test may damage."""
    state = make_state(seed=1)
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, state)
    return path, state


def test_round_trip_of_a_full_train_state_is_bitwise(saved):
    path, state = saved
    loaded = checkpoint.load(path, like=blank_like(state))
    assert_same_state(loaded, state)
    assert isinstance(loaded, functrain.TrainState)
    assert loaded.algo_state["ema"].num_updates == 5  # NamedTuples come back as NamedTuples
    assert loaded.extra["callbacks"]["early_stop"] == {
        "best": 0.25,
        "wait": 2,
        "monitor": "loss",
        "on": True,
    }


def test_round_trip_memory_store(saved):
    _, state = saved
    checkpoint.save("memory://reader/roundtrip", state)
    assert_same_state(checkpoint.load("memory://reader/roundtrip", like=blank_like(state)), state)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.int8,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_every_dtype_round_trips_bitwise(tmp_path, dtype):
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (64,), dtype=torch.uint8, generator=gen)
    width = torch.empty((), dtype=dtype).element_size()
    if dtype == torch.bool:
        value = raw[:16] % 2 == 1
    else:  # arbitrary bit patterns, NaNs and infinities included
        value = raw[: 16 * width].view(dtype).reshape(4, -1)
    state = {"x": value, "odd": value.flatten()[:5]}
    checkpoint.save(tmp_path / "c", state)
    loaded = checkpoint.load(
        tmp_path / "c", like={"x": torch.empty_like(value), "odd": torch.empty(5, dtype=dtype)}
    )
    assert same_bits(loaded["x"], value) and same_bits(loaded["odd"], value.flatten()[:5])


def test_load_without_like_returns_flat_keys(saved):
    path, state = saved
    flat = checkpoint.load(path)
    assert flat["step"] == state.step
    assert same_bits(flat["params.fc.weight"], state.params["fc.weight"])
    assert flat["extra.callbacks.early_stop.monitor"] == "loss"


def test_like_of_meta_tensors_is_an_abstract_shape(saved):
    path, state = saved
    like = functrain.tree.tree_map(
        lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, state
    )
    loaded = checkpoint.load(path, like=like)
    assert loaded.params["fc.weight"].device.type == "cpu"
    assert_same_state(loaded, state)


def test_inplace_writes_into_like_tensors(saved):
    path, state = saved
    like = blank_like(state)
    target = like.params["fc.weight"]
    loaded = checkpoint.load(path, like=like, inplace=True)
    assert loaded.params["fc.weight"] is target and same_bits(target, state.params["fc.weight"])


def test_weights_only_keeps_everything_else_from_like(saved):
    path, state = saved
    like = blank_like(state)
    loaded = checkpoint.load(path, like=like, weights_only=True)
    assert same_bits(loaded.params["fc.weight"], state.params["fc.weight"])
    assert same_bits(loaded.buffers["bn.running_var"], state.buffers["bn.running_var"])
    assert loaded.step == 0 and loaded.opt_state[0].mu["fc.weight"].abs().sum() == 0


def test_finetune_with_another_head_by_ignore(saved):
    path, state = saved
    like = functrain.init(Net(width=8), functrain.optim.sgd(lr=0.1))
    like = like.replace(
        params={**like.params, "head.weight": torch.zeros(5, 8), "head.bias": torch.zeros(5)}
    )
    loaded = checkpoint.load(path, like=like, weights_only=True, ignore=("params.head.*",))
    assert same_bits(loaded.params["fc.weight"], state.params["fc.weight"])
    assert (
        loaded.params["head.weight"].shape == (5, 8)
        and loaded.params["head.weight"].abs().sum() == 0
    )


def test_missing_and_unknown_keys_are_named(saved):
    path, state = saved
    like = blank_like(state)
    like = like.replace(params={**like.params, "extra.weight": torch.zeros(2)}, extra={})
    with pytest.raises(CheckpointMismatchError) as err:
        checkpoint.load(path, like=like)
    message = str(err.value)
    assert "'params.extra.weight'" in message and "missing" in message
    assert "'extra.callbacks.early_stop.best'" in message and "unknown" in message
    assert "ignore=" in message and "strict=False" in message and path in message
    loaded = checkpoint.load(path, like=like, strict=False)  # missing keep like, unknown skipped
    assert loaded.params["extra.weight"].abs().sum() == 0
    assert same_bits(loaded.params["fc.weight"], state.params["fc.weight"])
    loaded = checkpoint.load(path, like=like, ignore=("params.extra.weight", "extra"))
    assert same_bits(loaded.params["fc.bias"], state.params["fc.bias"])


def test_shape_mismatch_names_the_file_and_fix(saved):
    path, _ = saved
    like = blank_like(make_state(width=6))
    with pytest.raises(
        CheckpointMismatchError, match=r"shape \[8, 4\] in the checkpoint but \[6, 4\]"
    ) as err:
        checkpoint.load(path, like=like)
    message = str(err.value)
    assert os.path.join(path, "params.fc.weight") in message and "ignore=" in message
    assert "29 leaves do not fit" in message and "and 19 more" in message  # all at once


def test_dtype_mismatch_names_the_fix(saved):
    path, state = saved
    like = blank_like(state)
    like = like.replace(params={**like.params, "fc.weight": like.params["fc.weight"].double()})
    with pytest.raises(
        CheckpointMismatchError,
        match=r"float32 in the checkpoint but float64.*cast `like` to torch.float32",
    ):
        checkpoint.load(path, like=like)


def test_tensor_versus_scalar_mismatch(saved):
    path, state = saved
    like = blank_like(state).replace(step=torch.zeros(()))
    with pytest.raises(
        CheckpointMismatchError, match="'step' is a scalar in the checkpoint but a tensor"
    ):
        checkpoint.load(path, like=like)


def _chunk(path: str, key: str) -> pathlib.Path:
    files = sorted(p for p in (pathlib.Path(path) / key / "c").rglob("*") if p.is_file())
    assert files, f"no chunk files under {key}"
    return files[0]


def test_corrupted_chunk_fails_its_checksum(fresh):
    path, state = fresh
    chunk = _chunk(path, "params.fc.weight")
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="params.fc.weight") as err:
        checkpoint.load(path, like=blank_like(state))
    assert "earlier checkpoint" in str(err.value) and "igest" in str(err.value)


def test_truncated_chunk_is_detected(fresh):
    path, state = fresh
    chunk = _chunk(path, "opt_state.0.mu.fc.weight")
    chunk.write_bytes(chunk.read_bytes()[:10])
    with pytest.raises(CheckpointCorruptError, match="opt_state.0.mu.fc.weight"):
        checkpoint.load(path, like=blank_like(state))


def test_missing_chunk_is_an_error_not_zeros(fresh):
    path, state = fresh
    _chunk(path, "buffers.bn.running_mean").unlink()
    with pytest.raises(CheckpointCorruptError, match="buffers.bn.running_mean.*missing"):
        checkpoint.load(path, like=blank_like(state))


def test_truncated_zarr_json_is_named(fresh):
    path, state = fresh
    meta = pathlib.Path(path) / "params.head.bias" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:20])
    with pytest.raises(CheckpointCorruptError, match="params.head.bias"):
        checkpoint.load(path, like=blank_like(state))


def test_missing_commit_marker(fresh):
    path, state = fresh
    os.remove(os.path.join(path, layout.COMMIT_FILE))
    with pytest.raises(CheckpointNotCommittedError, match="COMMIT.json.*did not finish.*latest"):
        checkpoint.load(path, like=state)


def test_modified_tree_description_fails_its_checksum(fresh):
    path, state = fresh
    tree_file = pathlib.Path(path) / layout.TREE_FILE
    tree_file.write_bytes(tree_file.read_bytes().replace(b'"value":8', b'"value":9'))
    with pytest.raises(CheckpointCorruptError, match="tree.json does not match the checksum"):
        checkpoint.load(path, like=state)


def _rewrite_tree(path: str, edit) -> None:
    """Tamper with tree.json *and* fix up its checksum, as a deliberate attacker would."""
    tree_file = pathlib.Path(path) / layout.TREE_FILE
    tree = json.loads(tree_file.read_bytes())
    edit(tree)
    data = layout.dump_json(tree)
    tree_file.write_bytes(data)
    commit_file = pathlib.Path(path) / layout.COMMIT_FILE
    commit = json.loads(commit_file.read_bytes())
    commit["tree_blake2b"] = layout.digest(data)
    commit_file.write_bytes(layout.dump_json(commit))


@pytest.mark.parametrize(
    "evil", [["params", "../../outside"], ["/etc", "passwd"], [".."], ["params", "a\\..\\b"]]
)
def test_leaf_path_escaping_the_directory_is_refused(fresh, evil):
    path, state = fresh

    def edit(tree):
        leaf = next(x for x in tree["leaves"] if x["key"] == "params.fc.weight")
        leaf["path"], leaf["key_types"], leaf["key"] = evil, [2] * len(evil), ".".join(evil)

    _rewrite_tree(path, edit)
    with pytest.raises(CheckpointCorruptError, match="escape the checkpoint directory") as err:
        checkpoint.load(path, like=state)
    assert layout.TREE_FILE in str(err.value)


def test_malformed_leaf_entry_is_refused(fresh):
    path, state = fresh

    def edit(tree):
        tree["leaves"][1]["shape"] = "not a shape"

    _rewrite_tree(path, edit)
    with pytest.raises(CheckpointCorruptError, match="invalid leaf entry"):
        checkpoint.load(path, like=state)


def test_zarr_metadata_disagreeing_with_tree_description(fresh):
    path, state = fresh

    def edit(tree):
        leaf = next(x for x in tree["leaves"] if x["key"] == "params.fc.bias")
        leaf["shape"] = [9]

    _rewrite_tree(path, edit)
    like = blank_like(state)
    like = like.replace(params={**like.params, "fc.bias": torch.zeros(9)})
    with pytest.raises(
        CheckpointCorruptError, match=r"zarr.json says float32\[8\] but tree.json says float32\[9\]"
    ):
        checkpoint.load(path, like=like)


def test_nothing_there_and_manager_root_hint(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint at"):
        checkpoint.load(tmp_path / "nothing", like={})
    checkpoint.save(tmp_path / "root" / "step_000000001", {"a": torch.zeros(1)})
    with pytest.raises(CheckpointNotFoundError, match="Manager root.*latest"):
        checkpoint.load(tmp_path / "root", like={"a": torch.zeros(1)})


def test_checkpoint_package_never_unpickles():
    """Loading can never execute code: no pickle, torch.load or numpy object arrays anywhere."""
    root = pathlib.Path(functrain.checkpoint.__file__).parent
    for source in [*root.glob("*.py"), root.parent / "export.py"]:
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(
                    n.split(".")[0] in ("pickle", "dill", "cloudpickle") for n in names
                ), source
            if isinstance(node, ast.Attribute) and node.attr in ("load", "loads"):
                base = ast.unparse(node.value)
                assert base not in ("torch", "pickle", "np", "numpy"), (
                    f"{source}: {base}.{node.attr}"
                )
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                raise AssertionError(f"{source} allows pickle")


def _rewrite_commit(path: str, edit) -> None:
    commit_file = pathlib.Path(path) / layout.COMMIT_FILE
    commit = json.loads(commit_file.read_bytes())
    edit(commit)
    commit_file.write_bytes(layout.dump_json(commit))


def test_commit_listing_a_file_that_is_no_metadata_is_refused(fresh):
    # COMMIT.json's 'files' become paths: a name outside the leaf zarr.json / root files is an
    # attack or a corruption, refused before anything is opened.
    path, state = fresh
    _rewrite_commit(path, lambda c: c["files"].update({"../outside": "0" * 64}))
    with pytest.raises(CheckpointCorruptError, match="not a checkpoint metadata file"):
        checkpoint.load(path, like=state)


def test_a_state_saved_at_step_0_loads_with_its_step(tmp_path):
    # a checkpoint of the initial state (Composer's `save_interval` at batch 0; kills the
    # reader.py:172 mutant that refused step 0)
    state = functrain.init(Net(4), functrain.optim.adamw(lr=1e-3), seed=3)
    assert int(state.step) == 0
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, state)
    loaded = checkpoint.load(path, like=blank_like(state))
    assert int(loaded.step) == 0
    assert_same_state(loaded, state)


def test_a_commit_without_a_file_list_still_loads(fresh):
    # COMMIT.json's "files" is optional (commits written before it existed); the stray-array
    # check then has nothing to compare (kills the reader.py:133 mutant)
    path, state = fresh
    commit_path = os.path.join(path, layout.COMMIT_FILE)
    with open(commit_path) as f:
        commit = json.load(f)
    assert "files" in commit
    del commit["files"]
    with open(commit_path, "w") as f:
        json.dump(commit, f)
    assert_same_state(checkpoint.load(path, like=blank_like(state)), state)


def test_the_step_check_reads_the_states_own_step_leaf(tmp_path):
    # an int leaf ("t", before "step" in the tree) must not be taken for the step
    from typing import NamedTuple

    class State(NamedTuple):
        t: int
        step: int
        w: torch.Tensor

    state = State(t=3, step=7, w=torch.ones(2))
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, state)
    loaded = checkpoint.load(path, like=State(t=0, step=0, w=torch.zeros(2)))
    assert loaded.t == 3 and loaded.step == 7 and torch.equal(loaded.w, state.w)


def test_scalar_leaves_load_without_like_and_refuse_an_unusable_like(tmp_path):
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, {"i": 2**62, "f": 0.25, "w": torch.ones(1)})  # also 0-d arrays for orbax
    assert os.path.isdir(os.path.join(path, "i"))
    flat = checkpoint.load(path)
    assert flat["i"] == 2**62 and flat["f"] == 0.25
    with pytest.raises(checkpoint.CheckpointError, match="may hold only tensors"):
        checkpoint.load(path, like={"i": b"bytes", "f": 0.0, "w": torch.zeros(1)})


def test_more_than_ten_misfits_show_ten_and_count_the_rest(tmp_path):
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, {f"t{i:02d}": torch.zeros(2) for i in range(11)})
    with pytest.raises(CheckpointMismatchError) as err:
        checkpoint.load(path, like={f"t{i:02d}": torch.zeros(3) for i in range(11)})
    message = str(err.value)
    assert message.startswith("11 leaves do not fit")
    shown = [line for line in message.splitlines()[1:] if "leaf 't" in line]
    assert [line.split("leaf '")[1][:3] for line in shown] == [f"t0{i}" for i in range(10)]
    assert message.rstrip().endswith("... and 1 more")
