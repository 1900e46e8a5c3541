"""The Manager: save intervals, retention, asynchronous saves, crashes, auto-resume, fine-tunes."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from ckpt_helpers import assert_same_state, blank_like, make_state, same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain import checkpoint
from functrain.checkpoint import Manager, retained_steps, writer
from functrain.checkpoint.errors import CheckpointError
from functrain.checkpoint.schedule import SaveSchedule
from functrain.units import Timestamp

LEASE_FILES = {"LEASE.json"}  # the run's lease of the root (see test_lease)


def _step_dirs(root) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith("step_"))


def tiny(step: int, epoch: int = 0, value: float = 0.0) -> functrain.TrainState:
    return functrain.TrainState(
        step=step,
        params={"w": torch.full((3,), float(value))},
        buffers={},
        opt_state=(),
        rng=functrain.RngState(),
        timestamp=Timestamp(epoch=epoch, batch=step),
    )


# -- when to save -----------------------------------------------------------------------------


def _saved_at(schedule: SaveSchedule, timestamps) -> list:
    """The timestamps a run asking `due` at each one, and saving when told, saves at."""
    saved, last = [], None
    for ts in timestamps:
        if schedule.due(ts, last) and schedule.due(ts, last):  # a question: asking changes nothing
            saved.append(ts)
            last = schedule.index(ts)
    return saved


def test_should_save_every_n_batches():
    saved = _saved_at(SaveSchedule.parse("3ba"), [Timestamp(batch=b) for b in range(1, 11)])
    assert [ts.batch for ts in saved] == [3, 6, 9]


def test_should_save_each_epoch_once():
    schedule, ts, seen = SaveSchedule.parse("1ep"), Timestamp(batches_per_epoch=3), []
    for _ in range(2):
        for _ in range(3):
            ts = ts.advance_batch(samples=4)
            seen.append(ts)
        ts = ts.advance_epoch()
        seen += [ts, ts]  # asked twice at the same moment: saved once
    assert [(t.epoch, t.batch) for t in _saved_at(schedule, seen)] == [(1, 3), (2, 6)]


def test_should_save_samples_and_duration():
    ts, seen = Timestamp(), []
    for _ in range(6):
        ts = ts.advance_batch(samples=48)
        seen.append(ts)
    saved = _saved_at(SaveSchedule.parse("64sp"), seen)
    assert [t.sample for t in saved] == [96, 144, 192, 288]  # each multiple of 64 crossed, once
    half = _saved_at(
        SaveSchedule.parse("0.5dur"), [Timestamp(batch=b, max_batches=10) for b in range(1, 11)]
    )
    assert [t.batch for t in half] == [5, 10]


def test_should_save_is_a_question_and_save_records_the_answer():
    manager = Manager("memory://mgr/pure", every="2ba", async_save=False, lease_ttl=None)
    assert not manager.should_save(Timestamp(batch=1))
    assert manager.should_save(Timestamp(batch=2)) and manager.should_save(Timestamp(batch=2))
    manager.save(tiny(2))
    assert not manager.should_save(Timestamp(batch=2))
    assert not manager.should_save(Timestamp(batch=3)) and manager.should_save(Timestamp(batch=4))
    manager.close()


def test_restore_does_not_trigger_an_immediate_save():
    manager = Manager("memory://mgr/resume", every="2ba", async_save=False)
    manager.save(tiny(4))
    resumed = Manager("memory://mgr/resume", every="2ba", async_save=False)
    state = resumed.restore(tiny(0))
    assert state.step == 4
    assert not resumed.should_save(Timestamp(batch=4))
    assert not resumed.should_save(Timestamp(batch=5)) and resumed.should_save(Timestamp(batch=6))


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="keep_last must be a positive int"):
        Manager("memory://mgr/bad", keep_last=0)
    with pytest.raises(ValueError, match="keep_every=.*ep, ba, sp or tok"):
        Manager("memory://mgr/bad", keep_every="0.5dur")
    with pytest.raises(ValueError, match="cannot parse"):
        Manager("memory://mgr/bad", every="soon")


# -- retention --------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    steps=st.sets(st.integers(0, 60), min_size=1, max_size=15),
    keep_last=st.one_of(st.none(), st.integers(1, 5)),
    keep_every=st.one_of(st.none(), st.integers(1, 12)),
)
def test_retention_law(steps, keep_last, keep_every):
    kept = retained_steps(steps, keep_last=keep_last, keep_every=keep_every)
    ordered = sorted(steps)
    newest = set(ordered if keep_last is None else ordered[-keep_last:])
    periodic = {s for s in steps if keep_every and s % keep_every == 0}
    assert kept == newest | periodic | {max(steps)}
    assert max(steps) in kept and kept <= set(steps)


@settings(max_examples=12, deadline=None)
@given(
    saves=st.lists(st.integers(1, 40), min_size=1, max_size=7, unique=True),
    keep_last=st.integers(1, 3),
    keep_every=st.one_of(st.none(), st.integers(2, 10)),
)
def test_manager_applies_retention_after_each_commit(saves, keep_last, keep_every):
    root = f"memory://retention/{len(saves)}-{keep_last}-{keep_every}-{'-'.join(map(str, saves))}"
    manager = Manager(
        root, every=None, keep_last=keep_last, keep_every=keep_every, async_save=False
    )
    committed = []
    for step in saves:
        manager.save(tiny(step))
        committed.append(step)
        # Retention runs on the checkpoints present, newest by step (not by save order).
        expected = retained_steps(committed, keep_last=keep_last, keep_every=keep_every)
        assert {s for s, _ in manager.checkpoints()} == expected
        committed = sorted(expected)
    assert manager.latest().endswith(f"step_{max(saves):09d}")


def test_keep_every_time_uses_the_saved_timestamps(tmp_path):
    manager = Manager(tmp_path, every=None, keep_last=1, keep_every="2ep", async_save=False)
    for step in range(1, 6):
        manager.save(tiny(step * 10, epoch=step))
    assert [s for s, _ in manager.checkpoints()] == [20, 40, 50]


def test_failed_save_deletes_nothing(tmp_path, monkeypatch):
    manager = Manager(tmp_path, every=None, keep_last=1, async_save=False)
    manager.save(tiny(1))
    monkeypatch.setattr(
        writer, "_commit", lambda *a, **k: (_ for _ in ()).throw(OSError("no space"))
    )
    with pytest.raises(OSError, match="no space"):
        manager.save(tiny(2))
    assert [s for s, _ in manager.checkpoints()] == [1]


# -- asynchronous saves -----------------------------------------------------------------------


def test_async_save_equals_sync_save(tmp_path):
    state = make_state()
    sync_path = Manager(tmp_path / "sync", async_save=False).save(state)
    manager = Manager(tmp_path / "async", async_save=True)
    async_path = manager.save(state)
    manager.wait()

    def tree_json(path):
        with open(os.path.join(path, "tree.json"), "rb") as f:
            return f.read()

    assert tree_json(sync_path) == tree_json(async_path)
    assert_same_state(
        checkpoint.load(async_path, like=blank_like(state)),
        checkpoint.load(sync_path, like=blank_like(state)),
    )
    manager.close()


def test_async_save_captures_the_state_at_the_call(tmp_path):
    state = make_state()
    expected = state.params["fc.weight"].clone()
    with Manager(tmp_path, async_save=True) as manager:
        manager.save(state)
        state.params["fc.weight"].add_(100.0)  # a donating step right after save() returned
        manager.wait()
        loaded = checkpoint.load(manager.latest(), like=blank_like(state))
    assert same_bits(loaded.params["fc.weight"], expected)


def test_background_error_surfaces_at_the_next_call(tmp_path, monkeypatch):
    manager = Manager(tmp_path, async_save=True)

    def broken(*args, **kwargs):
        raise OSError("bucket unreachable")

    monkeypatch.setattr(writer, "write", broken)
    manager.save(tiny(1))  # returns: the failure happens in the background
    with pytest.raises(
        CheckpointError, match="asynchronous save of step 1 .* failed: bucket unreachable"
    ):
        manager.save(tiny(2))
    monkeypatch.undo()
    manager.save(tiny(3))
    manager.close()
    assert [s for s, _ in manager.checkpoints()] == [3]
    with pytest.raises(RuntimeError, match="closed"):
        manager.save(tiny(4))


def test_same_step_is_saved_once_unless_forced(tmp_path):
    manager = Manager(tmp_path, async_save=False)
    first = manager.save(tiny(5, value=1.0))
    assert manager.save(tiny(5, value=2.0)) == first
    assert checkpoint.load(first, like=tiny(0)).params["w"].tolist() == [1.0] * 3
    manager.save(tiny(5, value=2.0), force=True)
    assert checkpoint.load(first, like=tiny(0)).params["w"].tolist() == [2.0] * 3


# -- crashes, resume and fine-tunes -----------------------------------------------------------

_KILLED_SAVER = textwrap.dedent(
    """
    import sys, time, torch
    import functrain
    from functrain.checkpoint import Manager, array_store, writer

    def state(step, n):
        params = {f"w{i}": torch.full((64, 64), float(step)) for i in range(n)}
        return functrain.TrainState(step=step, params=params, buffers={}, opt_state=(),
                                    rng=functrain.RngState())

    manager = Manager(sys.argv[1], every="1ba", async_save=True)
    manager.save(state(1, 4))
    manager.wait()
    print("committed", flush=True)
    results = writer._result
    count = [0]
    def slow_result(future, url, what):  # stall half-way through the array writes
        count[0] += 1
        if count[0] == 20:
            print("midway", flush=True)
            time.sleep(60)
        return results(future, url, what)
    writer._result = slow_result
    write_all = array_store.write_all
    def slow_write_all(*args):  # a consolidated save: stall once its arrays are written
        committing = write_all(*args)
        committing.result()
        print("midway", flush=True)
        time.sleep(60)
        return committing
    array_store.write_all = slow_write_all
    manager.save(state(2, 40))
    manager.wait()
    print("finished", flush=True)
    """
)


def test_sigkill_mid_save_leaves_the_previous_checkpoint(tmp_path):
    root = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVER, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "committed"
        assert child.stdout.readline().strip() == "midway"
        assert os.path.isdir(root / "step_000000002.tmp")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        child.stdout.close()
    manager = Manager(root, async_save=False)
    assert manager.latest() == str(root / "step_000000001")
    like = functrain.TrainState(
        step=0,
        params={f"w{i}": torch.zeros(64, 64) for i in range(4)},
        buffers={},
        opt_state=(),
        rng=functrain.RngState(),
    )
    restored = manager.restore(like)
    assert restored.step == 1 and all(bool((w == 1.0).all()) for w in restored.params.values())
    manager.save(restored.replace(step=3))  # the next save clears the interrupted one
    assert _step_dirs(root) == ["step_000000001", "step_000000003"]


def test_autoresume_picks_the_newest_committed(tmp_path):
    manager = Manager(tmp_path, every="1ba", keep_last=5, async_save=True)
    assert manager.restore(make_state()) is None  # a fresh run
    for seed in range(3):
        manager.save(make_state(seed=seed))
    os.makedirs(tmp_path / "step_000000099")  # an uncommitted directory is never picked
    manager.close()
    resumed = Manager(tmp_path, every="1ba").restore(blank_like(make_state()))
    assert_same_state(resumed, make_state(seed=2))


def test_finetune_from_another_runs_weights(tmp_path):
    source = make_state(seed=4)
    pretrained = checkpoint.save(tmp_path / "pretrained", source)
    fresh = make_state(seed=9)
    manager = Manager(tmp_path / "finetune", init_from=pretrained, init_ignore=("params.head.*",))
    state = manager.restore(fresh)
    assert same_bits(state.params["fc.weight"], source.params["fc.weight"])
    assert same_bits(state.params["head.weight"], fresh.params["head.weight"])  # ignored
    assert state.step == fresh.step and same_bits(
        state.opt_state[0].mu["fc.weight"], fresh.opt_state[0].mu["fc.weight"]
    )
    manager.save(state)
    manager.wait()
    # Once the fine-tune has its own checkpoint, auto-resume prefers it over init_from.
    again = Manager(tmp_path / "finetune", init_from=pretrained).restore(blank_like(fresh))
    assert again.step == fresh.step and same_bits(
        again.params["head.weight"], fresh.params["head.weight"]
    )
    manager.close()


def test_stale_directories_are_collected(tmp_path):
    (tmp_path / "step_000000005.tmp" / "params.w").mkdir(parents=True)
    (tmp_path / "step_000000002.deleting").mkdir()
    (tmp_path / "unrelated").mkdir()
    manager = Manager(tmp_path, async_save=False)
    manager.save(tiny(6))
    assert sorted(set(os.listdir(tmp_path)) - LEASE_FILES) == ["step_000000006", "unrelated"]


# -- publishing commits, and who closes a manager --------------------------------------------


def test_on_commit_subscribers_hear_each_commit_once():
    heard = []

    def hear(step, url):
        heard.append((step, url))

    manager = Manager("memory://mgr/on_commit", every=None, lease_ttl=None, on_commit=[hear])
    manager.subscribe(hear)  # already subscribed: still called once per commit
    first = manager.save(tiny(1))
    second = manager.save(tiny(2))
    manager.close()
    assert heard == [(1, first), (2, second)]
    with pytest.raises(TypeError, match="on_commit takes functions"):
        manager.subscribe("print")


def test_a_manager_is_a_context_manager_that_gives_its_root_back(tmp_path):
    with Manager(tmp_path, every=None) as manager:
        manager.save(tiny(1))
        assert (tmp_path / "LEASE.json").exists()
    assert not (tmp_path / "LEASE.json").exists()
    with pytest.raises(RuntimeError, match="is closed; create a new one"):
        manager.save(tiny(2))


def test_released_manager_takes_the_lease_again_when_used(tmp_path):
    manager = Manager(tmp_path, every=None, async_save=False)
    manager.save(tiny(1))
    manager.release()
    assert not (tmp_path / "LEASE.json").exists()
    assert manager.restore(tiny(0)).step == 1  # the lease is taken again, lazily
    assert (tmp_path / "LEASE.json").exists()
    manager.close()


def test_the_checkpoint_package_imports_neither_the_launcher_nor_the_teardown():
    package = Path(checkpoint.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                text = f"{getattr(node, 'module', None)} {names}"
                assert "launch" not in text and "teardown" not in text, (path.name, text)


# -- keep the best k by a monitored metric (issue 31 point 1) ----------------------------------

_BEST_SAVER = textwrap.dedent(
    """
    import os, signal, sys, torch
    import functrain
    from functrain.checkpoint import Manager
    manager = Manager(sys.argv[1], every=None, keep_last=1, keep_best=2,
                      monitor="eval/accuracy", mode="max", async_save=False)
    for step, accuracy in ((1, 0.5), (2, 0.9), (3, 0.7)):
        state = functrain.TrainState(step=step, params={"w": torch.zeros(3)}, buffers={},
                                     opt_state=(), rng=functrain.RngState())
        manager.save(state, metrics={"eval/accuracy": accuracy, "eval/loss": float("nan")})
    os.kill(os.getpid(), signal.SIGKILL)  # killed: nothing closes the manager
    """
)


def test_keep_best_ranking_survives_a_kill_and_resume(tmp_path):
    root = tmp_path / "run"
    child = subprocess.run([sys.executable, "-c", _BEST_SAVER, str(root)], timeout=300)
    assert child.returncode == -signal.SIGKILL
    assert _step_dirs(root) == ["step_000000002", "step_000000003"]  # best two (and the last)
    manager = Manager(root, every=None, keep_last=1, keep_best=2, monitor="eval/accuracy")
    assert manager.restore(tiny(0)).step == 3
    manager.save(tiny(4), metrics={"eval/accuracy": 0.6})
    manager.wait()
    assert _step_dirs(root) == ["step_000000002", "step_000000003", "step_000000004"]
    manager.save(tiny(5), metrics={"eval/accuracy": torch.tensor(0.8)})
    manager.close()
    # 0.9 (step 2) saved before the kill still ranks first; 0.8 beats 0.7; the last is kept.
    assert _step_dirs(root) == ["step_000000002", "step_000000005"]


def test_keep_best_by_the_lowest_and_its_arguments():
    manager = Manager("memory://mgr/best-min", every=None, keep_last=1, keep_best=1,
                      monitor="eval/loss", mode="min", async_save=False)  # fmt: skip
    for step, loss in ((1, 0.3), (2, 0.1), (3, 0.2)):
        manager.save(tiny(step), metrics={"eval/loss": loss})
    assert [s for s, _ in manager.checkpoints()] == [2, 3]
    with pytest.raises(ValueError, match="name it, e.g. Manager"):
        Manager("memory://mgr/bad", keep_best=2)
    with pytest.raises(ValueError, match="mode must be 'max' or 'min'"):
        Manager("memory://mgr/bad", keep_best=2, monitor="eval/loss", mode="lowest")
