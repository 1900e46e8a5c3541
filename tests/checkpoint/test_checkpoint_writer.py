"""Saving: the layout on disk, the commit protocol, and what cannot be saved."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorstore as ts
import torch
from ckpt_helpers import blank_like, make_state, same_bits

from functrain import checkpoint
from functrain.checkpoint import durable, layout, sharding, staging, storage, writer
from functrain.checkpoint.errors import CheckpointError


def test_layout_follows_orbax_and_commit_is_written_last(tmp_path, monkeypatch):
    written = []  # the names of each write, in order
    one, many = storage.write_bytes, storage.write_many
    monkeypatch.setattr(
        storage, "write_bytes", lambda loc, n, data: (written.append({n}), one(loc, n, data))
    )
    monkeypatch.setattr(
        storage, "write_many", lambda loc, files: (written.append(set(files)), many(loc, files))
    )
    state = make_state()
    checkpoint.save(tmp_path / "c", state)
    # The marker is in the last write (locally written with the root files, before the one
    # flush and the rename that commit it), and nothing names it before.
    assert layout.COMMIT_FILE in written[-1] and layout.TREE_FILE in set().union(*written)
    assert all(layout.COMMIT_FILE not in names for names in written[:-1])
    names = set(os.listdir(tmp_path / "c"))
    assert {
        "_METADATA",
        "_CHECKPOINT_METADATA",
        "commit_success.txt",
        "tree.json",
        "COMMIT.json",
    } <= names
    assert {
        "params.fc.weight",
        "opt_state.0.mu.head.bias",
        "algo_state.ema.params.fc.weight",
        "step",
    } <= names
    assert os.path.isfile(tmp_path / "c" / "params.fc.weight" / "zarr.json")
    assert not os.path.exists(tmp_path / "c.tmp")  # renamed into place once committed
    metadata = json.loads((tmp_path / "c" / "_METADATA").read_text())
    entry = metadata["tree_metadata"]["('opt_state', '0', 'mu', 'fc.weight')"]
    assert [k["key_type"] for k in entry["key_metadata"]] == [2, 1, 2, 2]
    assert entry["value_metadata"]["value_type"] == "np.ndarray"
    assert metadata["use_zarr3"] and not metadata["use_ocdbt"]
    commit = json.loads((tmp_path / "c" / "COMMIT.json").read_text())
    assert commit["step"] == state.step and commit["timestamp"]["batch"] == state.timestamp.batch
    assert commit["tree_blake2b"] == layout.digest((tmp_path / "c" / "tree.json").read_bytes())


def test_arrays_open_without_functrain(tmp_path):
    """The arrays are plain zarr3: tensorstore opens them, and so does 20 lines of numpy."""
    weight = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    checkpoint.save(tmp_path / "c", {"w": weight, "b": weight.to(torch.bfloat16)})
    array = ts.open({"driver": "zarr3", "kvstore": f"file://{tmp_path}/c/w/"}).result()
    np.testing.assert_array_equal(array.read().result(), weight.numpy())
    meta = json.loads((tmp_path / "c" / "w" / "zarr.json").read_text())
    assert meta["codecs"] == [
        {"configuration": {"endian": "little"}, "name": "bytes"},
        {"name": "crc32c"},
    ]
    raw = (tmp_path / "c" / "w" / "c" / "0" / "0").read_bytes()
    body, crc = raw[:-4], int.from_bytes(raw[-4:], "little")
    assert crc == _crc32c(body)  # the chunk's checksum, verifiable by anyone
    np.testing.assert_array_equal(
        np.frombuffer(body, "<f4").reshape(meta["chunk_grid"]["configuration"]["chunk_shape"]),
        weight.numpy(),
    )


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bitwise -- slow but independent of any library."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_large_tensors_are_split_into_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "TARGET_CHUNK_BYTES", 1024)
    value = torch.randn(100, 7)  # 2800 bytes -> 3 chunks of 34 rows
    checkpoint.save(tmp_path / "c", {"x": value})
    chunks = sorted(p.name for p in (tmp_path / "c" / "x" / "c").iterdir())
    assert chunks == ["0", "1", "2"]
    assert same_bits(checkpoint.load(tmp_path / "c", like={"x": torch.empty(100, 7)})["x"], value)


def test_existing_checkpoint_needs_overwrite(tmp_path):
    checkpoint.save(tmp_path / "c", {"a": torch.zeros(2)})
    with pytest.raises(
        CheckpointError, match="already holds a committed checkpoint; pass overwrite=True"
    ):
        checkpoint.save(tmp_path / "c", {"a": torch.ones(2)})
    checkpoint.save(tmp_path / "c", {"a": torch.ones(2)}, overwrite=True)
    assert checkpoint.load(tmp_path / "c", like={"a": torch.zeros(2)})["a"].tolist() == [1.0, 1.0]
    assert sorted(os.listdir(tmp_path)) == ["c"]  # no .tmp or .old left behind


def test_failed_write_leaves_no_committed_checkpoint(tmp_path, monkeypatch):
    checkpoint.save(tmp_path / "c", {"a": torch.zeros(2)})

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_commit", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(tmp_path / "c", {"a": torch.ones(2)}, overwrite=True)
    # The old checkpoint is intact; the failed one never became visible under the final name.
    assert checkpoint.load(tmp_path / "c", like={"a": torch.ones(2)})["a"].tolist() == [0.0, 0.0]
    assert writer.committed(storage.resolve(tmp_path / "c"))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: {"a/b": torch.zeros(1)}, "would escape the checkpoint directory"),
        (lambda: {"..": torch.zeros(1)}, "would escape the checkpoint directory"),
        (lambda: {"tree.json": torch.zeros(1)}, "reserves"),
        (
            lambda: {"a.b": torch.zeros(1), "a": {"b": torch.zeros(1)}},
            "share the dotted path 'a.b'",
        ),
        (lambda: {"obj": object()}, "leaf 'obj' is a object; checkpoints store tensors"),
        (lambda: {"meta": torch.empty(2, device="meta")}, "meta tensor"),
        (
            lambda: {"q": torch.empty(2, dtype=torch.bits8)},
            "dtype torch.bits8, which checkpoints cannot store",
        ),
    ],
)
def test_unsaveable_states_are_refused_with_the_fix(tmp_path, make, message):
    with pytest.raises((CheckpointError, TypeError), match=message):
        checkpoint.save(tmp_path / "c", make())
    assert not os.path.exists(tmp_path / "c")


def test_scalars_get_orbax_arrays_and_json_values(tmp_path):
    state = {"i": 2**62, "big": 2**70, "f": 0.1, "t": True, "s": "text", "w": torch.ones(1)}
    checkpoint.save(tmp_path / "c", state)
    like = {"i": 0, "big": 0, "f": 0.0, "t": False, "s": "", "w": torch.zeros(1)}
    loaded = checkpoint.load(tmp_path / "c", like=like)
    assert loaded["i"] == 2**62 and loaded["big"] == 2**70 and loaded["f"] == 0.1
    assert loaded["t"] is True and loaded["s"] == "text"
    assert os.path.isdir(tmp_path / "c" / "i") and not os.path.isdir(tmp_path / "c" / "big")
    assert json.loads((tmp_path / "c" / "_strings.json").read_text()) == {"s": "text"}


def test_blank_like_round_trip_through_stage_and_write(tmp_path):
    state = make_state(seed=3)
    url = writer.write(staging.stage(state), storage.resolve(tmp_path / "x"))
    assert url == str(tmp_path / "x")
    loaded = checkpoint.load(url, like=blank_like(state))
    assert same_bits(loaded.extra["mixed"]["e4m3"], state.extra["mixed"]["e4m3"])


def test_ints_beyond_int64_up_to_uint64_get_a_uint64_array(tmp_path):
    assert writer._scalar_array(2**63 + 5).dtype == np.uint64
    assert int(writer._scalar_array(2**63 + 5)) == 2**63 + 5
    assert int(writer._scalar_array(2**64 - 1)) == 2**64 - 1
    assert writer._scalar_array(2**64) is None  # JSON value only
    assert writer._scalar_array(-(2**63) - 1) is None
    state = {"u": 2**63 + 5, "neg": -(2**63) - 1, "w": torch.ones(1)}
    checkpoint.save(tmp_path / "c", state)
    assert os.path.isdir(tmp_path / "c" / "u") and not os.path.isdir(tmp_path / "c" / "neg")
    loaded = checkpoint.load(tmp_path / "c", like={"u": 0, "neg": 0, "w": torch.zeros(1)})
    assert loaded["u"] == 2**63 + 5 and loaded["neg"] == -(2**63) - 1


def test_orbax_step_metadata_records_start_and_commit_times(tmp_path, monkeypatch):
    import types

    # the writer's clock, fixed: started at 1234.5 s, committed at 1234.6 s (in ns)
    clock = types.SimpleNamespace(time=lambda: 1234.5, time_ns=lambda: 1_234_600_000_000)
    monkeypatch.setattr(writer, "time", clock)
    checkpoint.save(tmp_path / "c", {"w": torch.ones(2)})
    meta = json.loads((tmp_path / "c" / layout.ORBAX_CHECKPOINT_METADATA).read_text())
    assert meta["init_timestamp_nsecs"] == 1_234_500_000_000
    assert meta["commit_timestamp_nsecs"] == 1_234_600_000_000


def test_every_file_is_made_durable_by_one_flush_before_the_commit(tmp_path, monkeypatch):
    # A local checkpoint is committed by the rename of `<name>.tmp` into place: every file,
    # the marker included, must be durable before it, by one flush rather than one per file.
    events = []  # ("sync", files present), ("rename", destination), in order
    original_sync, original_rename = durable.sync_tree, storage.rename_dir

    def sync(path):
        original_sync(path)
        files = {
            os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs
        }
        events.append(("sync", files))

    def rename(src, dst):
        events.append(("rename", dst.local_path))
        original_rename(src, dst)

    monkeypatch.setattr(durable, "sync_tree", sync)
    monkeypatch.setattr(storage, "rename_dir", rename)
    fsyncs = []
    original_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), original_fsync(fd)))
    checkpoint.save(tmp_path / "c", make_state())
    assert events[-1] == ("rename", str(tmp_path / "c"))
    syncs = [files for kind, files in events if kind == "sync"]
    on_disk = {
        os.path.relpath(os.path.join(d, f), tmp_path / "c")
        for d, _, fs in os.walk(tmp_path / "c")
        for f in fs
    }
    # Every file, the marker included, was on disk (and flushed) before the rename.
    assert layout.COMMIT_FILE in on_disk and on_disk <= syncs[-1]
    assert len(on_disk) > 40  # many files ...
    assert len(syncs) == 1 and len(fsyncs) <= 2  # ... one flush, and the rename's directory


def test_sync_tree_without_syncfs_fsyncs_every_file_and_directory(tmp_path, monkeypatch):
    (tmp_path / "a" / "c").mkdir(parents=True)
    for name in ("a/zarr.json", "a/c/0", "tree.json"):
        (tmp_path / name).write_bytes(b"x")
    synced = []
    original_fsync = os.fsync
    monkeypatch.setattr(durable, "_syncfs", lambda path: False)
    monkeypatch.setattr(
        os,
        "fsync",
        lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), original_fsync(fd)),
    )
    durable.sync_tree(str(tmp_path))
    expected = {str(tmp_path / p) for p in ("a/zarr.json", "a/c/0", "tree.json", "a/c", "a")}
    assert expected | {str(tmp_path)} == set(synced)
    assert synced.index(str(tmp_path / "a" / "c" / "0")) < synced.index(str(tmp_path / "a" / "c"))
