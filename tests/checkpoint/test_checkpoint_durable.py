"""Early writeback: the writer queues each array's files for the disk as soon as they are
written, before the one flush that makes the checkpoint durable (a hint, never the guarantee)."""

from __future__ import annotations

import os

import torch

from functrain import checkpoint
from functrain.checkpoint import durable, layout


def test_start_writeback_leaves_the_files_as_they_are_and_skips_a_missing_directory(tmp_path):
    (tmp_path / "a" / "c").mkdir(parents=True)
    (tmp_path / "a" / "c" / "0").write_bytes(b"chunk")
    (tmp_path / "a" / "zarr.json").write_bytes(b"{}")
    durable.start_writeback(str(tmp_path / "a"))
    durable.start_writeback(str(tmp_path / "missing"))
    assert (tmp_path / "a" / "c" / "0").read_bytes() == b"chunk"
    assert (tmp_path / "a" / "zarr.json").read_bytes() == b"{}"


def test_every_array_is_queued_for_the_disk_before_the_flush_that_commits(tmp_path, monkeypatch):
    events = []
    original_start, original_sync = durable.start_writeback, durable.sync_tree

    def start(path):
        events.append(("writeback", os.path.basename(path), os.listdir(path)))
        original_start(path)

    def sync(path):
        events.append(("sync", None, None))
        original_sync(path)

    def start_file(fd):  # a chunk written directly (local_chunk_writes): <key>/c/...
        name = os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path / "c.tmp")
        events.append(("writeback", name.split(os.sep)[0], ["c"]))
        original_start_file(fd)

    original_start_file = durable.start_file_writeback
    monkeypatch.setattr(durable, "start_writeback", start)
    monkeypatch.setattr(durable, "start_file_writeback", start_file)
    monkeypatch.setattr(durable, "sync_tree", sync)
    state = {"w": torch.ones(3, 4), "b": torch.zeros(4), "n": 7}
    checkpoint.save(tmp_path / "c", state)
    started = {name for kind, name, _ in events if kind == "writeback"}
    assert started == {"w", "b", "n"}  # every array (the int too: a 0-d array for orbax)
    assert all("c" in files for kind, _, files in events if kind == "writeback")  # written
    assert events[-1][0] == "sync" and [k for k, _, _ in events].count("sync") == 1
    assert os.path.exists(tmp_path / "c" / layout.COMMIT_FILE)


def test_a_save_without_fsync_queues_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(durable, "start_writeback", calls.append)
    monkeypatch.setattr(durable, "start_file_writeback", calls.append)
    checkpoint.save(tmp_path / "c", {"w": torch.ones(3)}, storage_options={"fsync": False})
    assert calls == []
