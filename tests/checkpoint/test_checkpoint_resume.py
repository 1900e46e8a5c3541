"""Auto-resume when the newest checkpoint is damaged (issue 13 point 5), leftovers of a resumed
run with nothing left to train (point 11), and nonsense Manager arguments (point 9)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import untrusted_attacks as atk
from ckpt_helpers import assert_same_state, blank_like, make_state
from torch.utils.data import TensorDataset

import functrain
from functrain import checkpoint
from functrain.checkpoint import Manager, reader
from functrain.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointStorageError,
)
from functrain.data import Loader


def _damage_a_chunk(path: str, key: str = "params.fc.weight") -> None:
    chunk = next(f for f in atk.files_of(path) if f.startswith(key + "/c/"))
    data = bytearray(atk.read(os.path.join(path, chunk)))
    data[1] ^= 0x01
    atk.replace(os.path.join(path, chunk), bytes(data))


def _root_of_three(root) -> list[functrain.TrainState]:
    states = [make_state(seed=s) for s in range(3)]  # steps 7, 8, 9
    manager = Manager(root, every=None, async_save=False)
    for s in states:
        manager.save(s)
    manager.close()
    return states


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_restored(tmp_path, caplog):
    states = _root_of_three(tmp_path)
    _damage_a_chunk(str(tmp_path / "step_000000009"))
    manager = Manager(tmp_path, every=None)
    with caplog.at_level(logging.WARNING, logger="functrain.checkpoint"):
        restored = manager.restore(blank_like(states[2]))
    assert_same_state(restored, states[1])
    assert manager.restored_from == str(tmp_path / "step_000000008")
    names = sorted(os.listdir(tmp_path))
    assert "step_000000009.corrupt-chunk" in names and "step_000000009" not in names
    assert manager.latest() == str(tmp_path / "step_000000008")
    lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(lines) == 1 and "step_000000009" in lines[0] and "corrupt-chunk" in lines[0]
    assert "\n" not in lines[0]
    # Nothing was deleted: the damaged checkpoint is intact beside the others.
    aside = tmp_path / "step_000000009.corrupt-chunk"
    assert sorted(atk.files_of(str(aside))) == sorted(
        atk.files_of(str(tmp_path / "step_000000008"))
    )
    # A save of the same step later (the run retrains it) lands beside the one set aside.
    manager.save(states[2])
    manager.close()
    assert {"step_000000009", "step_000000009.corrupt-chunk"} <= set(os.listdir(tmp_path))


def test_several_damaged_checkpoints_are_skipped_in_turn(tmp_path):
    states = _root_of_three(tmp_path)
    _damage_a_chunk(str(tmp_path / "step_000000009"))
    atk.set_zarr(str(tmp_path / "step_000000008"), "params.fc.weight", shape=[4, 8])
    restored = Manager(tmp_path, every=None).restore(blank_like(states[0]))
    assert_same_state(restored, states[0])
    assert {"step_000000009.corrupt-chunk", "step_000000008.corrupt-metadata"} <= set(
        os.listdir(tmp_path)
    )


def test_strict_resume_stops_and_touches_nothing(tmp_path):
    _root_of_three(tmp_path)
    _damage_a_chunk(str(tmp_path / "step_000000009"))
    before = sorted(os.listdir(tmp_path))
    manager = Manager(tmp_path, every=None, fallback=False)
    with pytest.raises(CheckpointCorruptError, match="fallback=False.*rename it to step_000000009"):
        manager.restore(blank_like(make_state()))
    manager.close()
    assert sorted(os.listdir(tmp_path)) == before


def test_a_checkpoint_that_does_not_fit_like_is_not_called_damaged(tmp_path):
    _root_of_three(tmp_path)
    wider = make_state(width=16)
    with pytest.raises(CheckpointMismatchError):
        Manager(tmp_path, every=None).restore(blank_like(wider))
    assert not [n for n in os.listdir(tmp_path) if "corrupt" in n]


def test_a_storage_failure_is_not_called_damage(tmp_path, monkeypatch):
    _root_of_three(tmp_path)

    def unreachable(*args, **kwargs):
        raise CheckpointStorageError("reading ... failed: UNAVAILABLE: connection refused")

    monkeypatch.setattr(reader, "load", unreachable)
    with pytest.raises(CheckpointStorageError):
        Manager(tmp_path, every=None).restore(blank_like(make_state()))
    assert not [n for n in os.listdir(tmp_path) if "corrupt" in n]


def _regression(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    opt = functrain.optim.adamw(lr=0.05)
    step = functrain.make_step(model, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), opt)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, generator=gen)
    data = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))
    return step, functrain.init(model, opt, seed=seed), data


def test_fit_autoresume_falls_back_and_matches_the_uninterrupted_run(tmp_path):
    step, state, data = _regression()
    full = functrain.fit(step, state, Loader(data, 4, seed=3), duration="2ep")
    step, state, data = _regression()
    with Manager(tmp_path, every="2ba", keep_last=3) as manager:
        functrain.fit(step, state, Loader(data, 4, seed=3), duration="1ep", checkpoints=manager)
    _damage_a_chunk(checkpoint.latest(tmp_path), "params.weight")
    step, state, data = _regression(seed=9)  # everything must come from the checkpoint
    with Manager(tmp_path, every="2ba", keep_last=3) as manager:
        resumed = functrain.fit(step, state, Loader(data, 4, seed=3), duration="2ep",
                                checkpoints=manager, autoresume=True)  # fmt: skip
    assert resumed.step == full.step == 16
    for key in full.params:
        assert torch.equal(resumed.params[key], full.params[key]), key  # bit-identical
    assert "step_000000008.corrupt-chunk" in os.listdir(tmp_path)


def test_a_resumed_run_with_nothing_left_cleans_up_and_applies_retention(tmp_path):
    step, state, data = _regression()
    with Manager(tmp_path, every="1ba", keep_last=None) as manager:
        functrain.fit(step, state, Loader(data, 4, seed=3), duration="1ep", checkpoints=manager)
    (tmp_path / "step_000000003.deleting" / "params.weight").mkdir(parents=True)
    (tmp_path / "step_000000009.tmp").mkdir()
    assert len([n for n in os.listdir(tmp_path) if n[5:].isdigit()]) == 8
    step, state, data = _regression()
    with Manager(tmp_path, every="1ba", keep_last=2) as manager:
        done = functrain.fit(step, state, Loader(data, 4, seed=3), duration="1ep",
                             checkpoints=manager, autoresume=True)  # fmt: skip
    assert done.step == 8
    assert sorted(os.listdir(tmp_path)) == ["step_000000007", "step_000000008"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(every=0), "every=0 would never save"),
        (dict(every="0ba"), "would never save"),
        (dict(every=-3), "cannot be negative"),
        (dict(every="2dur"), "longer than the run"),
        (dict(every=True), "every must be"),
        (dict(keep_last=True), "keep_last must be a positive int"),
        (dict(keep_last=0), "keep_last must be a positive int"),
        (dict(keep_every=False), "keep_every must be"),
        (dict(async_save="no"), "async_save must be True or False"),
        (dict(fallback=1), "fallback must be True or False"),
        (dict(lease_ttl=0), "lease_ttl must be a positive number"),
        (dict(lease_ttl=float("nan")), "lease_ttl must be a positive number"),
        (dict(init_ignore="params.head.*"), "init_ignore must be a list"),
    ],
)
def test_nonsense_manager_arguments_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Manager("memory://resume/bad", **kwargs)


def test_every_rank_resumes_the_same_checkpoint_when_one_rank_finds_damage(tmp_path):
    worker = os.path.join(os.path.dirname(__file__), "resume_worker.py")
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, worker, str(root), str(tmp_path / "rendezvous"), str(out), "2"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for seen in ranks:
        assert seen["strict"] == "CheckpointCorruptError"  # rank 0 read its part without error
        assert seen["after_strict"] == ["step_000000001", "step_000000002"]
        assert seen["step"] == 1 and seen["values"]
        assert seen["after"] == ["step_000000001", "step_000000002.corrupt-chunk"]
        assert seen["lease"] == ranks[0]["pid"]  # only rank 0 holds the lease
