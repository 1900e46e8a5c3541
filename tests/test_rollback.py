"""Rollback on a loss spike: a batch built to spike the loss at step 40 is rolled back and
skipped, and the run ends bit-identical to one whose data never held that batch -- also when it
is killed right after the rollback and resumed (from a checkpoint after the spike, or from one
before it, which replays the same decision). With snapshots every k batches the rollback goes
back to the newest one and skips the whole range since it, with the same guarantees."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain.algorithms.rollback import (
    LossSpikeError,
    rollback_guard,
    skipped_batches,
    skipped_ranges,
)
from functrain.checkpoint import Manager

SPIKE = 39  # the index of the 40th batch: step 40
BATCHES = 60


def _loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def _batches(spike: bool, spikes=(SPIKE,), dropped=None) -> list:
    """The data; `spike=False`: without the batches `dropped` (default: the spikes)."""
    dropped = set(spikes if dropped is None else dropped)
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(BATCHES):
        x = torch.randn(8, 4, generator=generator)
        y = x @ torch.ones(4, 1)
        if not spike and i in dropped:
            continue  # the data that never held them
        if spike and i in spikes:
            y = y * 1000.0  # targets off by three orders of magnitude: the loss explodes
        out.append((x, y))
    return out


def _run(spike: bool, guard: bool, root=None, crash=None, every=1, spikes=(SPIKE,), dropped=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = functrain.optim.adamw(lr=1e-2)
    step = functrain.make_step(model, _loss, opt)
    if guard:
        step = functrain.compose(step, rollback_guard(factor=5.0, every=every))
    state = functrain.init(model, opt, seed=0)
    data = _batches(spike, spikes, dropped)
    callbacks = [] if crash is None else [_CrashAt(crash)]
    kwargs = dict(duration=f"{len(data)}ba", progress=False, callbacks=callbacks)
    if root is None:
        return functrain.fit(step, state, data, **kwargs)
    with Manager(root, every="7ba", keep_last=None) as manager:
        return functrain.fit(step, state, data, checkpoints=manager, autoresume=True, **kwargs)


class _CrashAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            raise RuntimeError("simulated crash")


def _assert_same_training(a, b):
    for part in ("params", "buffers", "opt_state"):
        la = functrain.tree.leaves_with_paths(getattr(a, part))
        lb = functrain.tree.leaves_with_paths(getattr(b, part))
        assert [p for p, _ in la] == [p for p, _ in lb]
        for (path, x), (_, y) in zip(la, lb):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y), f"{part}.{path}"
            else:
                assert x == y, f"{part}.{path}"


@pytest.fixture(scope="module")
def clean():
    return _run(spike=False, guard=False)


def test_the_spike_is_rolled_back_and_skipped(clean, caplog):
    unguarded = _run(spike=True, guard=False)
    assert not torch.equal(unguarded.params["0.weight"], clean.params["0.weight"])  # it hurts
    with caplog.at_level(logging.WARNING, logger="functrain.rollback"):
        guarded = _run(spike=True, guard=True)
    assert skipped_batches(guarded) == [SPIKE]
    _assert_same_training(guarded, clean)
    assert guarded.step == clean.step + 1  # the skipped batch was consumed
    [record] = [r for r in caplog.records if r.name == "functrain.rollback"]
    assert "at step 40 (batch 39)" in record.getMessage()
    assert "skipped batches [39, 39]" in record.getMessage()


@pytest.mark.filterwarnings("ignore:resuming list")  # a list of batches resumes by replaying
@pytest.mark.parametrize("crash", [41, 44])  # resumed from step 35 (before) / 42 (after)
def test_killed_after_the_rollback_and_resumed_the_same(tmp_path, clean, crash):
    with pytest.raises(functrain.CallbackError, match="simulated crash"):
        _run(spike=True, guard=True, root=tmp_path, crash=crash)
    resumed = _run(spike=True, guard=True, root=tmp_path)
    assert skipped_batches(resumed) == [SPIKE]
    _assert_same_training(resumed, clean)


@pytest.mark.parametrize("every, first", [(8, 32), (5, 35), (40, 0)])
def test_a_spike_rolls_back_to_the_newest_snapshot_and_skips_the_range(every, first, caplog):
    """Snapshots every `every` batches: the spike at batch 39 goes back to the one after batch
    `first` (with every=40: the initial state) and skips batches [first, 39]; the run ends
    bit-identical to one whose data never held them."""
    clean = _run(spike=False, guard=False, dropped=range(first, SPIKE + 1))
    with caplog.at_level(logging.WARNING, logger="functrain.rollback"):
        guarded = _run(spike=True, guard=True, every=every)
    assert skipped_ranges(guarded) == [(first, SPIKE)]
    assert skipped_batches(guarded) == list(range(first, SPIKE + 1))
    _assert_same_training(guarded, clean)
    assert guarded.step == clean.step + SPIKE + 1 - first  # the skipped batches were consumed
    [record] = [r for r in caplog.records if r.name == "functrain.rollback"]
    assert "at step 40 (batch 39)" in record.getMessage()
    assert f"skipped batches [{first}, 39]" in record.getMessage()


@settings(max_examples=8, deadline=None)
@given(every=st.integers(1, 45), spike=st.integers(12, BATCHES - 2))
def test_a_rollback_equals_training_without_the_skipped_range(every, spike):
    """The law, for any snapshot interval and spike: the range skipped runs from the newest
    multiple of `every` at or before the spike's batch (the spike's batch alone for every=1),
    and the run equals one whose data never held that range."""
    first = spike // every * every
    guarded = _run(spike=True, guard=True, every=every, spikes=(spike,))
    clean = _run(spike=False, guard=False, dropped=range(first, spike + 1))
    assert skipped_ranges(guarded) == [(first, spike)]
    _assert_same_training(guarded, clean)


def test_a_spike_right_after_a_rollback_skips_only_its_own_batch():
    """The state a rollback restored is the newest snapshot: a spike at the next batch skips
    only that one (the earlier range is already skipped)."""
    spikes = (SPIKE, SPIKE + 1)
    clean = _run(spike=False, guard=False, dropped=range(32, SPIKE + 2))
    guarded = _run(spike=True, guard=True, every=8, spikes=spikes)
    assert skipped_ranges(guarded) == [(32, SPIKE), (SPIKE + 1, SPIKE + 1)]
    _assert_same_training(guarded, clean)


@pytest.mark.filterwarnings("ignore:resuming list")  # a list of batches resumes by replaying
@pytest.mark.parametrize("crash", [41, 44])  # resumed from step 35 (before) / 42 (after)
def test_a_range_rollback_killed_and_resumed_is_the_same(tmp_path, crash):
    """Resumed from step 35, the snapshot after batch 32 is in the checkpoint: the spike at 39
    rolls back to it again; resumed from step 42, the rollback is in the checkpoint."""
    clean = _run(spike=False, guard=False, dropped=range(32, SPIKE + 1))
    with pytest.raises(functrain.CallbackError, match="simulated crash"):
        _run(spike=True, guard=True, root=tmp_path, crash=crash, every=8)
    resumed = _run(spike=True, guard=True, root=tmp_path, every=8)
    assert skipped_ranges(resumed) == [(32, SPIKE)]
    _assert_same_training(resumed, clean)


def test_a_loss_that_stays_high_is_an_error_not_a_spike():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = functrain.optim.adamw(lr=1e-2)
    step = functrain.compose(functrain.make_step(model, _loss, opt), rollback_guard(max_in_a_row=2))
    state = functrain.init(model, opt, seed=0)
    x = torch.randn(8, 4)
    nan = (x, torch.full((8, 1), float("nan")))
    with pytest.raises(RuntimeError, match="2 steps in a row") as info:
        functrain.fit(step, state, [nan, nan, nan], duration="3ba", progress=False)
    assert isinstance(info.value.__cause__, LossSpikeError)


@pytest.mark.parametrize("kwargs", [dict(factor=1.0), dict(window=0), dict(max_in_a_row=True)])
def test_settings_that_cannot_work_are_refused(kwargs):
    with pytest.raises(ValueError, match="rollback_guard"):
        rollback_guard(**kwargs)
