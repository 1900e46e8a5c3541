"""The loop's state adapter: `SingleState` (one TrainState, advanced by its step) and `StateTree`
(a FitState, advanced here, its horizon copied inward), and `adapter_for`'s choice."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import functrain
from functrain.loop.fit_state import FitState
from functrain.loop.state_adapter import SingleState, StateTree, adapter_for
from functrain.state import TrainState
from functrain.units import Timestamp


def train_state(seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(3, 1)
    opt = functrain.optim.sgd(lr=0.1)
    return functrain.init(model, opt, seed=seed)


def horizon(state):
    return state.timestamp.batches_per_epoch, state.timestamp.max_batches


def inner_horizons(run):
    return {k: horizon(v) for k, v in run.states.items() if isinstance(v, TrainState)}


def test_adapter_for_picks_single_for_a_train_state_and_keeps_it():
    state = train_state()
    adapter, loop_state = adapter_for(state, world_size=4)
    assert isinstance(adapter, SingleState)
    assert loop_state is state


def test_adapter_for_wraps_a_pytree_and_keeps_a_fit_state():
    states = {"g": train_state(0), "d": train_state(1)}
    adapter, run = adapter_for(states, world_size=2)
    assert isinstance(adapter, StateTree) and adapter.world_size == 2
    assert isinstance(run, FitState) and run.states is states
    assert run.timestamp == Timestamp()
    again, same = adapter_for(run)
    assert isinstance(again, StateTree) and same is run  # a continued run stays itself


def test_single_state_takes_what_its_step_returned():
    adapter, state = SingleState(), train_state()
    advanced = state.replace(step=1, timestamp=state.timestamp.advance_batch(8))
    calls = []

    def step(s, batch):
        calls.append((s, batch))
        return advanced, {"loss": 0.5}

    assert adapter.step_state(state) is state
    output, metrics = adapter.call(step, state, "batch")
    assert calls == [(state, "batch")]
    assert adapter.after_step(state, output, metrics, "batch") is advanced


def test_single_state_refuses_what_is_not_state_and_metrics():
    adapter, state = SingleState(), train_state()
    with pytest.raises(TypeError, match="as its metrics; a step returns"):
        adapter.after_step(state, state, 0.5, None)
    with pytest.raises(TypeError, match="returned a dict for a TrainState"):
        adapter.after_step(state, {"g": state}, {"loss": 0.5}, None)


def test_single_state_writes_the_timestamp_and_horizon_as_given():
    adapter, state = SingleState(), train_state()
    ts = Timestamp(batch=3, elapsed_sec=1.5, batches_per_epoch=10, max_batches=30)
    assert adapter.with_timestamp(state, ts).timestamp == ts
    assert adapter.with_horizon(state, ts).timestamp == ts
    assert state.timestamp == Timestamp()  # a new value, the old one unchanged


def test_single_state_init_is_the_steps():
    class Step:
        def init_state(self, s):
            return s.replace(step=7)

    assert SingleState().init(Step(), train_state()).step == 7


def test_state_tree_passes_the_pytree_and_advances_the_loops_position():
    tree = StateTree(world_size=2)
    states = {"g": train_state(0), "d": train_state(1)}
    run = FitState(states=states)
    stepped = {"g": states["g"].replace(step=1), "d": states["d"]}
    seen = []

    def step(s, batch):
        seen.append(s)
        return stepped, {"loss": 0.1}

    assert tree.step_state(run) is states
    output, metrics = tree.call(step, run, torch.zeros(8, 3))
    assert seen == [states]
    after = tree.after_step(run, output, metrics, torch.zeros(8, 3))
    assert after.states is stepped  # no tree walk on an ordinary step
    assert after.timestamp == Timestamp().advance_batch(16)  # 8 rows on each of 2 ranks


def test_state_tree_counts_the_steps_reported_samples_and_tokens():
    tree, run = StateTree(world_size=2), FitState(states={})
    after = tree.after_step(run, {}, {"samples": 5, "tokens": 40}, torch.zeros(8, 3))
    assert (after.timestamp.sample, after.timestamp.token) == (5, 40)
    # a bool is not a count: the batch is counted instead
    after = tree.after_step(run, {}, {"samples": True, "tokens": False}, torch.zeros(8, 3))
    assert (after.timestamp.sample, after.timestamp.token) == (16, 0)


def test_state_tree_refuses_metrics_that_are_not_a_mapping():
    with pytest.raises(TypeError, match="returned float as its metrics"):
        StateTree().after_step(FitState(states={}), {}, 0.5, None)


def test_state_tree_init_runs_the_step_on_the_pytree():
    class Step:
        def init_state(self, s):
            return {**s, "added": 1}

    run = StateTree().init(Step(), FitState(states={"a": 0}, timestamp=Timestamp(batch=4)))
    assert run.states == {"a": 0, "added": 1} and run.timestamp.batch == 4


def test_state_tree_copies_a_changed_horizon_inward_and_only_then():
    tree = StateTree()
    run = FitState(states={"g": train_state(0), "n": 3})
    # the clock moved, the horizon did not: the inner states are the same objects
    clocked = tree.with_timestamp(run, run.timestamp.replace(elapsed_sec=2.0))
    assert clocked.states is run.states and clocked.timestamp.elapsed_sec == 2.0
    longer = tree.with_timestamp(run, run.timestamp.replace(max_batches=50))
    assert inner_horizons(longer) == {"g": (0, 50)} and longer.states["n"] == 3
    # the inner counters stay their step's
    assert longer.states["g"].timestamp.batch == run.states["g"].timestamp.batch


def test_state_tree_with_horizon_always_copies_it_inward():
    tree = StateTree()
    inner = train_state(0)
    inner = inner.replace(timestamp=inner.timestamp.replace(max_batches=99))
    run = FitState(states={"g": inner}, timestamp=Timestamp(batches_per_epoch=5, max_batches=20))
    # the horizon is unchanged on the FitState, yet the inner state held another one
    shared = tree.with_horizon(run, run.timestamp)
    assert inner_horizons(shared) == {"g": (5, 20)}


operation = st.one_of(
    st.tuples(st.just("step"), st.integers(1, 64)),
    st.tuples(st.just("clock"), st.floats(0, 1e6)),
    st.tuples(st.just("horizon"), st.integers(0, 100), st.integers(0, 1000)),
    st.tuples(st.just("epoch")),
)


@given(st.lists(operation, max_size=20))
def test_state_tree_keeps_the_inner_horizon_the_runs_and_counts_each_step(ops):
    """Law: after the start, every inner TrainState holds the run's horizon, whatever the loop
    does next; the run's batch count is the number of steps and its samples their sum."""
    tree = StateTree()
    run = tree.with_horizon(
        FitState(states={"g": train_state(0), "d": train_state(1)}),
        Timestamp(batches_per_epoch=4, max_batches=12),
    )
    steps = samples = 0
    for op in ops:
        if op[0] == "step":
            run = tree.after_step(run, run.states, {"samples": op[1]}, None)
            steps, samples = steps + 1, samples + op[1]
        elif op[0] == "clock":
            run = tree.with_timestamp(run, run.timestamp.replace(elapsed_sec=op[1]))
        elif op[0] == "horizon":
            ts = run.timestamp.replace(batches_per_epoch=op[1], max_batches=op[2])
            run = tree.with_timestamp(run, ts)
        else:
            run = tree.with_timestamp(run, run.timestamp.advance_epoch())
        assert set(inner_horizons(run).values()) == {horizon(run)}
    assert (run.timestamp.batch, run.timestamp.sample) == (steps, samples)
