"""What the reader checks before tensorstore opens anything (issue 13, points 1-4 and 6): array
metadata against tree.json and a size bound, codec chains, the digests of every metadata file,
local files that are not regular, the step in COMMIT.json, tree.json and the directory name,
deep nesting, and the saved loop state. The attack suite (test_untrusted.py) runs the same and
many more in child processes; these name one property each."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import untrusted_attacks as atk
from ckpt_helpers import blank_like, make_state, same_bits

from functrain import checkpoint
from functrain.checkpoint import layout, verify
from functrain.checkpoint.errors import CheckpointCorruptError, CheckpointError
from functrain.loop import saved_state

W = "params.fc.weight"


@pytest.fixture
def ckpt(tmp_path):
    state = make_state(seed=1)  # step 8
    path = str(tmp_path / "step_000000008")
    checkpoint.save(path, state)
    return path, state


def test_writer_and_validator_agree_on_every_dtype(tmp_path):
    """zarr.json as written is exactly what the reader accepts (the writer's own bytes)."""
    state = {
        "t": {
            name: torch.zeros(3, 2).to(dtype)
            for name, dtype in checkpoint.dtypes.TORCH_DTYPES.items()
        }
    }
    checkpoint.save(tmp_path / "c", state)
    desc = checkpoint.describe(tmp_path / "c")
    for record in desc.records:
        data = (tmp_path / "c" / record.key / "zarr.json").read_bytes()
        meta = json.loads(data)
        assert verify.check_array_metadata(meta, record.key, record) == meta
        assert verify.encode(meta) == data
        assert desc.files[f"{record.key}/zarr.json"] == layout.digest(data)


@pytest.mark.parametrize("like", [True, False])
def test_a_huge_chunk_shape_is_corruption_not_an_abort(ckpt, like):
    path, state = ckpt
    atk.chunk_shape_of(path, W, [2**40, 4])  # tree.json and zarr.json agree, digests fixed
    with pytest.raises(CheckpointCorruptError, match="chunk shape .* larger than the array"):
        checkpoint.load(path, like=blank_like(state) if like else None)


def test_a_huge_shape_without_like_is_refused_before_allocating(ckpt):
    path, _ = ckpt
    atk.shape_of(path, W, [2**40, 4])
    with pytest.raises(
        CheckpointCorruptError, match=r"would allocate .*/params.fc.weight, declares.*like="
    ):
        checkpoint.load(path)


@pytest.mark.parametrize(
    "codecs",
    [
        [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}],
        [
            {"name": "transpose", "configuration": {"order": [1, 0]}},
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "crc32c"},
        ],
        [{"name": "bytes", "configuration": {"endian": "little"}}],  # the checksum removed
    ],
    ids=["big-endian", "transpose", "no-checksum"],
)
def test_codec_chains_other_than_functrains_are_refused(ckpt, codecs):
    path, state = ckpt
    atk.set_codecs(path, W, codecs)
    with pytest.raises(CheckpointCorruptError, match="codecs .* not the chain functrain writes"):
        checkpoint.load(path, like=blank_like(state))


@pytest.mark.parametrize("name", ["params.fc.weight/zarr.json", "_METADATA", "_strings.json"])
def test_every_metadata_file_is_under_the_commit_digest(ckpt, name):
    path, state = ckpt
    target = os.path.join(path, name)
    data = atk.read(target)
    atk.replace(target, data.replace(b"}", b" }", 1))  # the same JSON, other bytes
    with pytest.raises(CheckpointCorruptError, match="does not match the checksum in COMMIT.json"):
        checkpoint.load(path, like=blank_like(state))


def test_a_symlinked_array_directory_is_refused(ckpt, tmp_path):
    path, state = ckpt
    other = str(tmp_path / "other" / "step_000000008")
    checkpoint.save(other, make_state(seed=3).replace(step=8))
    atk.symlink(os.path.join(path, W), os.path.join(other, W))
    with pytest.raises(CheckpointCorruptError, match="params.fc.weight is a symbolic link"):
        checkpoint.load(path, like=blank_like(state))


def test_a_fifo_in_place_of_a_chunk_is_refused_without_reading(ckpt):
    path, state = ckpt
    chunk = next(f for f in atk.files_of(path) if f.startswith(W + "/c/"))
    atk.make_fifo(os.path.join(path, chunk))
    with pytest.raises(CheckpointCorruptError, match="is a FIFO, not a regular file"):
        checkpoint.load(path, like=blank_like(state))  # (it would block forever if opened)


def test_a_load_through_a_symlinked_checkpoint_directory_still_works(ckpt, tmp_path):
    """The path the user names may be a link (`latest -> step_000000008`); what is inside may not."""
    path, state = ckpt
    os.symlink(path, tmp_path / "latest")
    loaded = checkpoint.load(tmp_path / "latest", like=blank_like(state))
    assert same_bits(loaded.params["fc.weight"], state.params["fc.weight"])


def test_commit_step_must_match_the_directory_name(ckpt, tmp_path):
    path, state = ckpt
    renamed = str(tmp_path / "step_000000999")
    shutil.move(path, renamed)
    with pytest.raises(CheckpointCorruptError, match="step is inconsistent.*step_000000999.*999"):
        checkpoint.load(renamed, like=blank_like(state))
    other = str(tmp_path / "any-name")  # a directory not named after a step: not compared
    shutil.move(renamed, other)
    assert checkpoint.load(other, like=blank_like(state)).step == 8


def test_commit_step_must_match_tree_json_and_the_state(ckpt):
    path, state = ckpt
    atk.set_leaf(path, "step", value=7)
    with pytest.raises(CheckpointCorruptError, match="step leaf holds 7"):
        checkpoint.load(path, like=blank_like(state))


def test_deep_nesting_is_a_checkpoint_error(ckpt):
    path, state = ckpt
    atk.replace(os.path.join(path, "tree.json"), atk.deep(100_000).encode())
    atk.fix_digests(path)
    with pytest.raises(CheckpointCorruptError, match="tree.json.*nested too deeply"):
        checkpoint.load(path, like=blank_like(state))


def test_an_oversized_metadata_file_is_refused_unread(ckpt):
    path, state = ckpt
    tree = os.path.join(path, "tree.json")
    os.unlink(tree)
    with open(tree, "wb") as f:
        f.truncate(layout.MAX_JSON_BYTES + 1)  # sparse: no disk, no memory
    with pytest.raises(CheckpointCorruptError, match="tree.json is larger than"):
        checkpoint.load(path, like=blank_like(state))


def test_checkpoints_of_the_previous_format_still_load(ckpt):
    """A COMMIT.json without per-file digests (written before they existed) loads, validated."""
    path, state = ckpt
    atk.edit_json(path, "COMMIT.json", lambda c: c.pop("files"), fix=False)
    loaded = checkpoint.load(path, like=blank_like(state))
    assert same_bits(loaded.params["fc.weight"], state.params["fc.weight"])


# -- saved loop state (saved_state.encode_state / decode_state) -------------------------------------


def test_saved_tensors_name_dtypes_from_an_allowlist_only():
    text = json.dumps({"w": {"__tensor__": "load", "shape": [1], "data": [0]}})
    with pytest.raises(ValueError, match="names dtype 'load', not one of"):
        saved_state.decode_state(text)  # (it used to look up getattr(torch, "load"))
    with pytest.raises(TypeError, match="tensors of"):
        saved_state.encode_state({"q": torch.zeros(2, dtype=torch.float8_e4m3fn)})


def test_saved_state_round_trips_and_bad_states_say_why():
    value = {
        "c": torch.tensor([1 + 2j, 3j]),
        "b": torch.ones(2, dtype=torch.bfloat16),
        "n": [1, None],
    }
    back = saved_state.decode_state(saved_state.encode_state(value))
    assert torch.equal(back["c"], value["c"]) and back["b"].dtype == torch.bfloat16
    for text, why in [
        ("{not json", "not valid JSON"),
        (atk.deep(100_000), "nested too deeply"),
        (atk.deep(100), "nested more than"),
        (json.dumps({"__tensor__": "float32", "shape": [2**40], "data": [1]}), "'shape' must be"),
        (json.dumps({"__tensor__": "float32", "shape": [3], "data": [1]}), "'data' must be"),
        (json.dumps({"__tensor__": "float32", "shape": [2], "data": ["a", "b"]}), "'data' must be"),
    ]:
        with pytest.raises(ValueError, match=why):
            saved_state.decode_state(text)


def test_a_malformed_callback_state_names_the_file_and_the_fix(tmp_path):
    from torch.utils.data import TensorDataset

    import functrain
    from functrain.data import Loader

    class Best:
        name = "best"

        def __init__(self):
            self.best = 0.0

        def state_dict(self):
            return {"best": self.best}

        def load_state_dict(self, state):
            self.best = float(state["best"])

    def run():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = functrain.optim.sgd(lr=0.1)
        step = functrain.make_step(model, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), opt)
        data = TensorDataset(torch.ones(8, 3), torch.zeros(8, 1))
        return functrain.fit(step, functrain.init(model, opt), Loader(data, 4), duration="1ep",
                             callbacks=[Best()], checkpoints=str(tmp_path), autoresume=True)  # fmt: skip

    run()
    newest = checkpoint.latest(tmp_path)
    atk.set_leaf(newest, "extra.callbacks.best", value=json.dumps({"worst": 1}))
    with pytest.raises(
        CheckpointError, match=r"tree.json: the saved state of callback 'best'.*another `name`"
    ):
        run()
