"""Checkpoints in tiers: a fast local tier (own snapshot + a peer's replica) beside the root.

In one process: the interval law, the arguments refused, a damaged own snapshot falling back to
the replica, then to the root, and the tier deleted when the manager closes. In real processes
(gloo, two ranks on two simulated nodes): a rank killed and its node's tier deleted resumes from
the peer's replica at the local step and ends bit-identical to an uninterrupted run; with both
of the node's copies gone it resumes from the root.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import functrain
from functrain.checkpoint import Manager
from functrain.checkpoint import tiers as tiers_module
from functrain.checkpoint.errors import CheckpointError
from functrain.checkpoint.tiers import LocalTier
from functrain.data import Loader
from functrain.tree import leaves_with_paths

WORKER = os.path.join(os.path.dirname(__file__), "tiers_worker.py")


@given(every=st.integers(1, 20), batches=st.lists(st.integers(1, 200), max_size=30))
def test_a_snapshot_is_due_once_per_completed_interval(every, batches):
    tier, last, taken = LocalTier("/a", every=every), None, []
    for batch in sorted(set(batches)):
        if tier.due(batch, last):
            taken.append(batch)
            last = batch
    assert len({b // every for b in taken}) == len(taken)  # never twice in one interval
    assert all(b >= every for b in taken)
    if batches:
        assert (last or 0) // every == max(batches) // every  # the newest interval is covered


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(every=0), "every"),
        (dict(every=2, keep_last=0), "keep_last"),
        (dict(every=2, peer="/a"), "another node"),
    ],
)
def test_a_tier_that_cannot_work_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalTier("/a", **kwargs)


def _loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def _build():
    torch.manual_seed(0)
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = functrain.optim.adamw(lr=1e-2)
    data = torch.utils.data.TensorDataset(x, x @ torch.ones(4, 1))
    return functrain.make_step(model, _loss, opt), functrain.init(model, opt, seed=0), data


class _CrashAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            raise RuntimeError("simulated crash")


def _fit(root, tier, crash=None):
    step, state, data = _build()
    callbacks = [] if crash is None else [_CrashAt(crash)]
    with Manager(root, every="5ba", local=tier) as manager:
        return functrain.fit(step, state, Loader(data, 8, seed=1), duration="12ba",
                             checkpoints=manager, autoresume=True, callbacks=callbacks,
                             progress=False, return_result=True)  # fmt: skip


def _steps(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("step_"))


def _same(a, b):
    ta = dict(leaves_with_paths(a))
    tb = dict(leaves_with_paths(b))
    assert sorted(ta) == sorted(tb)
    for key, value in ta.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, tb[key]), key


@pytest.mark.parametrize("damage", ["none", "own", "own_and_replica"])
def test_resume_takes_the_newest_copy_that_loads(tmp_path, damage):
    reference = _fit(tmp_path / "ref", None).state
    tier = LocalTier(tmp_path / "node0", every=2, peer=tmp_path / "node1")
    with pytest.raises(functrain.CallbackError, match="simulated crash"):
        _fit(tmp_path / "root", tier, crash=9)
    own = tmp_path / "node0" / "rank0"
    assert _steps(own) == ["step_000000006", "step_000000008"]  # keep_last=2
    if damage != "none":
        snapshot = own / "step_000000008"
        data = [p for p in sorted(snapshot.rglob("*")) if p.is_file() and
                {"c", "d"} & set(p.relative_to(snapshot).parts[:-1])]  # fmt: skip
        for chunk in data:  # an array's chunk files (c/...) or the data files (d/...)
            chunk.write_bytes(b"damaged" + chunk.read_bytes())  # every array fails its digest
            break
        else:
            pytest.fail("no chunk found to damage")
    if damage == "own_and_replica":
        shutil.rmtree(tmp_path / "node1" / "replica-rank0")
    resumed = _fit(tmp_path / "root", tier)
    expected = {
        "none": "node0/rank0/step_000000008",
        "own": "node1/replica-rank0/step_000000008",
        "own_and_replica": "node0/rank0/step_000000006",  # the older own snapshot verifies
    }[damage]
    assert resumed.resumed_from.endswith(expected)
    assert resumed.finished
    _same(reference, resumed.state)
    assert not own.exists() and not (tmp_path / "node1" / "replica-rank0").exists()  # closed


def test_without_any_snapshot_the_root_is_used(tmp_path):
    reference = _fit(tmp_path / "ref", None).state
    tier = LocalTier(tmp_path / "node0", every=2, peer=tmp_path / "node1")
    with pytest.raises(functrain.CallbackError):
        _fit(tmp_path / "root", tier, crash=9)
    shutil.rmtree(tmp_path / "node0")
    shutil.rmtree(tmp_path / "node1")
    resumed = _fit(tmp_path / "root", tier)
    assert resumed.resumed_from.endswith("root/step_000000005")
    _same(reference, resumed.state)


def test_snapshots_of_another_root_are_not_resumed(tmp_path, caplog):
    tier = LocalTier(tmp_path / "node0", every=2, peer=tmp_path / "node1")
    with pytest.raises(functrain.CallbackError):
        _fit(tmp_path / "root_a", tier, crash=9)  # leaves its snapshots behind
    fresh = _fit(tmp_path / "root_b", tier)  # a new run, the same local folders
    assert fresh.resumed_from is None and fresh.finished
    assert "written for the root" in caplog.text
    _same(_fit(tmp_path / "ref", None).state, fresh.state)


def _state(value: float):
    _, state, _ = _build()
    for tensor in state.params.values():
        tensor.detach().fill_(value)
    return state.replace(step=3, timestamp=dataclasses.replace(state.timestamp, batch=3))


@pytest.mark.parametrize("async_save", [True, False])
def test_a_snapshot_holds_the_state_as_it_was_when_saved(tmp_path, async_save):
    """The state's tensors change in place right after `save` returns (a donating step does):
    the snapshot written in the background is still the state at the save."""
    tier = LocalTier(tmp_path / "node0", every=1, peer=tmp_path / "node1", async_save=async_save)
    state = _state(1.0)
    with Manager(tmp_path / "root", every=None, local=tier) as manager:
        url = manager.save(state, scheduled=True)  # the local snapshot alone
        assert url.endswith("node0/rank0/step_000000003")
        for tensor in state.params.values():
            tensor.detach().fill_(2.0)
        manager.wait()
        for folder in ("node0/rank0", "node1/replica-rank0"):
            loaded = functrain.checkpoint.load(tmp_path / folder / "step_000000003", _state(0.0))
            for name, tensor in loaded.params.items():
                assert torch.equal(tensor, torch.full_like(tensor, 1.0)), (folder, name)
        manager.close(keep_local=False)


def test_a_local_save_does_not_wait_for_the_write(tmp_path, monkeypatch):
    """`save` returns while the snapshot is still being written; `wait` returns once it is
    committed (a write held back by an event: no timing)."""
    release, writing = threading.Event(), threading.Event()
    write = tiers_module.Tiers._write

    def held_write(*args, **kwargs):
        writing.set()
        assert release.wait(60), "the test never released the write"
        return write(*args, **kwargs)

    monkeypatch.setattr(tiers_module.Tiers, "_write", held_write)
    tier = LocalTier(tmp_path / "node0", every=1)
    with Manager(tmp_path / "root", every=None, local=tier) as manager:
        manager.save(_state(1.0), scheduled=True)
        assert writing.wait(60)
        assert not (tmp_path / "node0" / "rank0" / "step_000000003").exists()
        release.set()
        manager.wait()
        assert _steps(tmp_path / "node0" / "rank0") == ["step_000000003"]


def test_a_failed_local_write_is_raised_by_the_next_wait(tmp_path, monkeypatch):
    def failing_write(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(tiers_module.Tiers, "_write", failing_write)
    manager = Manager(tmp_path / "root", every=None, local=LocalTier(tmp_path / "node0", every=1))
    try:
        manager.save(_state(1.0), scheduled=True)
        with pytest.raises(CheckpointError, match="no space left on device"):
            manager.wait()
    finally:
        manager.close()


class _StopAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            ctx.request_stop("stop on a local-tier step")


def test_a_stop_on_a_step_the_local_tier_saved_leaves_that_step_in_the_root(tmp_path):
    # Batch 6's scheduled save goes to the local tier only (the root saves every 5); the stop's
    # save must still reach the root, since closing the manager removes the local tier.
    step, state, data = _build()
    tier = LocalTier(tmp_path / "node0", every=3)
    with Manager(tmp_path / "root", every="5ba", local=tier) as manager:
        result = functrain.fit(step, state, Loader(data, 8, seed=1), duration="12ba",
                               checkpoints=manager, callbacks=[_StopAt(6)], progress=False,
                               return_result=True)  # fmt: skip
    assert result.state.timestamp.batch == 6 and not result.finished
    assert _steps(tmp_path / "root") == ["step_000000005", "step_000000006"]


def test_local_must_be_a_local_tier(tmp_path):
    with pytest.raises(TypeError, match="LocalTier"):
        Manager(tmp_path, local=str(tmp_path / "node0"))


# -- real processes: two ranks on two simulated nodes ---------------------------------------------


def _launch(base, name, *extra):
    run = base / name
    (run / "out").mkdir(parents=True, exist_ok=True)
    rendezvous = run / f"rdv{len(list(run.glob('rdv*')))}"
    cmd = [sys.executable, WORKER, str(base / "root"), str(base / "local"), str(run / "out"),
           str(rendezvous), *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _results(run):
    return [json.loads((run / "out" / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("reference")
    done = _launch(base, "ref")
    assert done.returncode == 0, done.stderr[-3000:]
    return _results(base / "ref")


@pytest.mark.slow
@pytest.mark.parametrize("lost", ["own_tier", "both_copies"])
def test_a_killed_rank_resumes_from_the_peer_replica(tmp_path, uninterrupted, lost):
    crashed = _launch(tmp_path, "crash", "--crash-at", "16")
    assert crashed.returncode != 0
    assert not (tmp_path / "crash" / "out" / "rank1.json").exists()
    node1 = tmp_path / "local" / "node1"
    assert _steps(node1 / "rank1") == ["step_000000012", "step_000000015"]
    shutil.rmtree(node1)  # the node is gone, and its tier with it
    if lost == "both_copies":
        shutil.rmtree(tmp_path / "local" / "node0" / "replica-rank1")
    resumed = _launch(tmp_path, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ranks = _results(tmp_path / "resume")
    if lost == "own_tier":
        assert ranks[0]["resumed_from"].endswith("node0/rank0/step_000000015")
        assert ranks[1]["resumed_from"].endswith("node0/replica-rank1/step_000000015")
    else:  # rank 1 has no snapshot at all: every rank takes the root's step 10
        assert all(r["resumed_from"].endswith("root/step_000000010") for r in ranks)
    for rank, reference in zip(ranks, uninterrupted):
        assert rank["step"] == 20
        assert rank["params"] == reference["params"]  # bit for bit (exact hex floats)
        assert rank["local_after_close"] == []  # a finished run leaves no local tier behind


# -- rollback on a loss spike, on two ranks ------------------------------------------------------


def _never_spiked(tmp_path_factory, name: str, *options: str) -> list:
    """Each rank's results of the run whose data never held the spike (`options`: the guard's)."""
    base = tmp_path_factory.mktemp(name)
    done = _launch(base, "clean", "--rollback", *options, "--clean")
    assert done.returncode == 0, done.stderr[-3000:]
    return _results(base / "clean")


@pytest.fixture(scope="module")
def never_spiked(tmp_path_factory):
    return _never_spiked(tmp_path_factory, "clean")


@pytest.mark.slow
@pytest.mark.parametrize("crash, snapshot", [(41, 39), (44, 42)])  # before / after the rollback
def test_both_ranks_skip_the_spike_also_when_killed_and_resumed(
    tmp_path, never_spiked, crash, snapshot
):
    """Only rank 1's batch 39 spikes: the loss agreed over ranks makes both skip it. Killed
    after the rollback and resumed from the local tier (node 1's own tier gone: its replica),
    from a snapshot before the spike (the decision is replayed) or after it (the decision is
    in the state), the run ends bit-identical to one whose data never held batch 39."""
    crashed = _launch(tmp_path, "crash", "--rollback", "--crash-at", str(crash))
    assert crashed.returncode != 0
    assert "skipped batches [39, 39]" in crashed.stderr
    shutil.rmtree(tmp_path / "local" / "node1")
    resumed = _launch(tmp_path, "resume", "--rollback")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ranks = _results(tmp_path / "resume")
    assert ranks[1]["resumed_from"].endswith(f"node0/replica-rank1/step_{snapshot:09d}")
    assert ("skipped batches [39, 39]" in resumed.stderr) == (snapshot < 40)  # replayed
    for rank, reference in zip(ranks, never_spiked):
        assert rank["skipped"] == [39]
        assert rank["params"] == reference["params"]  # bit for bit (exact hex floats)


@pytest.fixture(scope="module")
def never_spiked_range(tmp_path_factory):
    return _never_spiked(tmp_path_factory, "clean_range", "--every", "8")


@pytest.mark.slow
@pytest.mark.parametrize("crash, snapshot", [(41, 39), (44, 42)])  # before / after the rollback
def test_both_ranks_skip_the_range_also_when_killed_and_resumed(
    tmp_path, never_spiked_range, crash, snapshot
):
    """With snapshots every 8 batches, the spike at 39 rolls both ranks back to the snapshot
    after batch 32 and skips [32, 39]; killed and resumed from the local tier, before the spike
    (the snapshot is in the checkpoint: the same rollback) or after it, the run ends
    bit-identical to one whose data never held batches 32 to 39."""
    crashed = _launch(tmp_path, "crash", "--rollback", "--every", "8", "--crash-at", str(crash))
    assert crashed.returncode != 0
    assert "skipped batches [32, 39]" in crashed.stderr
    shutil.rmtree(tmp_path / "local" / "node1")
    resumed = _launch(tmp_path, "resume", "--rollback", "--every", "8")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ranks = _results(tmp_path / "resume")
    assert ranks[1]["resumed_from"].endswith(f"node0/replica-rank1/step_{snapshot:09d}")
    assert ("skipped batches [32, 39]" in resumed.stderr) == (snapshot < 40)  # replayed
    for rank, reference in zip(ranks, never_spiked_range):
        assert rank["skipped"] == list(range(32, 40))
        assert rank["params"] == reference["params"]  # bit for bit (exact hex floats)
