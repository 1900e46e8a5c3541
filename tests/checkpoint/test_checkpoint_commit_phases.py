"""Crash injection: a save interrupted at any point of its commit protocol never leaves half a state.

The save overwrites a committed checkpoint (all zeros) with a new one (all ones) and is made to
crash at each storage mutation in turn: every file write, delete, directory creation, rename and
the arrays' write. Whatever the crash point, the location afterwards is either not committed or
loads, whole, as exactly the old or the new state; on a local file system the old one stays
readable until the new one is complete.

Object stores delete a prefix key by key, in no promised order: a crash inside `delete_dir` is
modelled as the worst case, every key deleted but the commit marker. That is why the writer
removes the marker first ("un-commit first"); without that step this test fails.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from functrain import checkpoint
from functrain.checkpoint import layout, storage, writer
from functrain.checkpoint.errors import CheckpointError

_IDS = itertools.count()


class Crash(BaseException):
    """The injected crash (a BaseException, like the process dying: no handler wraps it)."""


def state(value: float) -> dict:
    return {
        "a": torch.full((3, 4), value),
        "b": torch.full((5,), value),
        "c": torch.full((2,), value),
    }


class Injector:
    """Counts the save's storage mutations; raises at mutation number `at` (None: never)."""

    def __init__(self, monkeypatch, at: int | None):
        self.at, self.count, self.points = at, 0, []
        names = ("write_bytes", "write_many", "delete_file", "delete_dir", "make_dir", "rename_dir")
        for name in names:
            monkeypatch.setattr(storage, name, self._wrap(name, getattr(storage, name)))
        monkeypatch.setattr(writer, "_write_arrays", self._wrap("arrays", writer._write_arrays))

    def _wrap(self, name, original):
        def call(*args, **kwargs):
            index = self.count
            self.count += 1
            self.points.append(name)
            if index == self.at:
                if name == "delete_dir" and not args[0].is_local:
                    self._partial_delete(args[0])
                elif name == "arrays":  # some arrays written, then the crash
                    original(*args, **kwargs)
                raise Crash(f"crash at {name} (mutation {index})")
            return original(*args, **kwargs)

        return call

    @staticmethod
    def _partial_delete(loc):
        # the worst order for a non-atomic prefix delete: everything but the commit marker
        for key in storage.list_keys(loc):
            if key != layout.COMMIT_FILE:
                storage.kvstore(loc).delete_range(storage.ts.KvStore.KeyRange(key, key + "\0"))


def _location(kind: str, tmp_path) -> str:
    return str(tmp_path / "c") if kind == "local" else f"memory://commit-phases/{next(_IDS)}/c"


def _mutations(kind: str, tmp_path, monkeypatch) -> list[str]:
    """The mutation points of one uninterrupted overwrite."""
    url = _location(kind, tmp_path)
    checkpoint.save(url, state(0.0))
    with monkeypatch.context() as patch:
        injector = Injector(patch, at=None)
        checkpoint.save(url, state(1.0), overwrite=True)
    return injector.points


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_crash_at_every_commit_phase_leaves_the_old_or_the_new_state(kind, tmp_path, monkeypatch):
    points = _mutations(kind, tmp_path / "dry", monkeypatch)
    assert {"arrays", "write_many"} <= set(points)
    if kind == "memory":
        assert points[0] == "delete_file"  # the commit marker goes first
    outcomes = []
    for at, point in enumerate(points):
        url = _location(kind, tmp_path / str(at))
        checkpoint.save(url, state(0.0))
        with monkeypatch.context() as patch:
            Injector(patch, at=at)
            with pytest.raises(Crash):
                checkpoint.save(url, state(1.0), overwrite=True)
        loc = storage.resolve(url)
        if not writer.committed(loc):
            with pytest.raises(CheckpointError):  # nothing half-written is ever loaded
                checkpoint.load(url, like=state(0.0))
            outcomes.append((point, "none"))
            continue
        try:
            loaded = checkpoint.load(url, like=state(5.0))
        except CheckpointError as err:
            pytest.fail(f"crash at {point} (#{at}) left a committed checkpoint that fails: {err}")
        values = {float(v.unique()) for v in loaded.values()}
        assert values in ({0.0}, {1.0}), f"crash at {point} (#{at}) left a mixed state: {loaded}"
        outcomes.append((point, "old" if values == {0.0} else "new"))
    if kind == "local":
        # the old checkpoint stays visible until the new one, committed, is renamed into place;
        # the one window without either is between moving the old aside and moving the new in
        # (`_move_into_place`: POSIX cannot rename over a non-empty directory)
        renames = [i for i, p in enumerate(points) if p == "rename_dir"]
        assert len(renames) == 2, points
        for at, (_, outcome) in enumerate(outcomes):
            expected = "old" if at <= renames[0] else "none" if at == renames[1] else "new"
            assert outcome == expected, (at, outcomes)
    assert any(o != "new" for _, o in outcomes)  # crashes did interrupt the save
