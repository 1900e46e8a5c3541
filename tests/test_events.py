"""Tests of functrain.loop.events and the loop's event order: exact call counts for a fixed run."""

import collections
import uuid

import pytest
import torch
from torch.utils.data import TensorDataset

import functrain
from functrain.checkpoint import Manager, load
from functrain.data import Loader
from functrain.loop import fit, predict
from functrain.loop.events import (
    CallbackError,
    Context,
    Event,
    callback_name,
    dispatch,
    scalar_metrics,
    unique_names,
)
from functrain.loop.saved_state import decode_state, encode_state


def fake_step(state, batch):
    """A pure step: w += mean of x (so progress is visible), counters advance."""
    x, _ = batch
    params = {"w": state.params["w"] + x.mean()}
    new = state.replace(
        step=state.step + 1,
        params=params,
        timestamp=state.timestamp.advance_batch(samples=x.shape[0]),
    )
    return new, {"loss": x.mean().abs(), "samples": x.shape[0]}


def fake_state():
    return functrain.TrainState(
        step=0, params={"w": torch.zeros(())}, buffers={}, opt_state=(), rng=functrain.RngState(0)
    )


def memory_manager(every="3ba"):
    """A real checkpoint Manager on a fresh in-memory store, keeping every checkpoint."""
    every = f"{every}ba" if isinstance(every, int) else every
    return Manager(f"memory://test_events/{uuid.uuid4().hex}", every=every, keep_last=None)


def saved_steps(manager):
    return [step for step, _ in manager.checkpoints()]


class Recorder:
    """Records every event it receives, in order."""

    def __init__(self):
        self.events = []
        for event in Event:
            setattr(self, event.value, self._make(event))

    def _make(self, event):
        def record(ctx):
            assert ctx.event is event
            self.events.append(event.value)

        return record


def dataset(n=12):
    return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.zeros(n))


def test_event_values_are_the_method_names():
    assert len(Event) == 16
    for event in Event:
        assert event.value == event.name.lower()


def test_exact_call_counts_for_a_run():
    # 12 samples / batch 4 = 3 batches per epoch, 2 epochs = 6 batches; eval every 2 batches
    # (batches 2, 4, 6) over 2 eval batches; checkpoint every 3 batches (3 and 6).
    recorder, manager = Recorder(), memory_manager(every=3)
    state = fit(
        fake_step,
        fake_state(),
        Loader(dataset(), 4, seed=0),
        duration="2ep",
        eval_data=[(torch.ones(2, 1), torch.zeros(2))] * 2,
        eval_interval="2ba",
        callbacks=[recorder],
        checkpoints=manager,
    )
    predict(torch.nn.Identity(), None, [torch.zeros(3, 1)] * 2, callbacks=[recorder])
    counts = collections.Counter(recorder.events)
    assert counts == {
        "init": 1,
        "fit_start": 1,
        "epoch_start": 2,
        "batch_start": 6,
        "batch_end": 6,
        "epoch_end": 2,
        "eval_start": 3,
        "eval_batch_start": 6,
        "eval_batch_end": 6,
        "eval_end": 3,
        "checkpoint": 2,
        "fit_end": 1,
        "predict_start": 1,
        "predict_batch_start": 2,
        "predict_batch_end": 2,
        "predict_end": 1,
    }
    assert state.timestamp.batch == 6 and state.timestamp.epoch == 2
    assert saved_steps(manager) == [3, 6]


def test_event_order_for_one_epoch():
    recorder = Recorder()
    fit(
        fake_step,
        fake_state(),
        Loader(dataset(8), 4, seed=0),
        duration="1ep",
        eval_data=[(torch.ones(2, 1), torch.zeros(2))],
        callbacks=[recorder],
        checkpoints=memory_manager(every=100),
    )
    assert recorder.events == [
        "init", "fit_start", "epoch_start",
        "batch_start", "batch_end", "batch_start", "batch_end",
        "epoch_end", "eval_start", "eval_batch_start", "eval_batch_end", "eval_end",
        "checkpoint",  # the final checkpoint
        "fit_end",
    ]  # fmt: skip


class MeanOutput:
    """A user metric under the protocol (update/compute/reset)."""

    def reset(self):
        self.total, self.count = 0.0, 0

    def update(self, outputs, targets):
        self.total += float(outputs.sum())
        self.count += outputs.numel()

    def compute(self):
        return self.total / self.count


def test_context_carries_metrics_eval_results_and_checkpoint_path():
    seen = {}

    class Observer:
        def batch_end(self, ctx):
            seen.setdefault("losses", []).append(float(ctx.metrics["loss"]))
            assert ctx.timestamp is ctx.state.timestamp
            assert ctx.batch[0].shape == (4, 1)

        def eval_end(self, ctx):
            seen["eval"] = dict(ctx.eval_metrics)

        def checkpoint(self, ctx):
            seen.setdefault("paths", []).append(ctx.checkpoint_path)

        def fit_end(self, ctx):
            seen["duration"] = str(ctx.duration)
            seen["world"] = (ctx.rank, ctx.world_size)

    fit(
        fake_step,
        fake_state(),
        Loader(dataset(8), 4, shuffle=False),
        duration="2ba",
        eval_data=[(torch.ones(2, 1), torch.zeros(2))],
        eval_fn=lambda model, batch: (batch[0] * 3, batch[1]),  # a plain-function step: no model
        eval_metrics={"mean_output": MeanOutput()},
        callbacks=[Observer()],
        checkpoints=memory_manager(every=1),
    )
    assert seen["losses"] == [1.5, 5.5]  # means of [0,1,2,3] and [4,5,6,7] with shuffle=False
    assert [p.rsplit("/", 1)[1] for p in seen["paths"]] == ["step_000000001", "step_000000002"]
    assert seen["eval"] == {"mean_output": 3.0}
    assert seen["duration"] == "2ba" and seen["world"] == (0, 1)


def test_request_stop_ends_the_run_after_the_step_and_checkpoints():
    class StopAtThree:
        def batch_end(self, ctx):
            if ctx.timestamp.batch == 3:
                ctx.request_stop("enough")

        def fit_end(self, ctx):
            self.reason = ctx.stop_reason

    stopper, manager = StopAtThree(), memory_manager(every=100)
    state = fit(
        fake_step,
        fake_state(),
        Loader(dataset(40), 4),
        duration="10ep",
        callbacks=[stopper],
        checkpoints=manager,
    )
    assert state.timestamp.batch == 3 and stopper.reason == "enough"
    assert saved_steps(manager) == [3]


def test_a_raising_callback_names_itself_and_the_event_and_keeps_checkpoints():
    class Broken:
        def batch_end(self, ctx):
            if ctx.timestamp.batch == 5:
                raise KeyError("boom")

    manager = memory_manager(every=2)
    with pytest.raises(CallbackError, match=r"'Broken' raised KeyError in batch_end\(\)") as info:
        fit(fake_step, fake_state(), Loader(dataset(40), 4), duration="2ep",
            callbacks=[Broken()], checkpoints=manager)  # fmt: skip
    assert info.value.event is Event.BATCH_END and isinstance(info.value.__cause__, KeyError)
    assert "epoch 0, batch 5" in str(info.value)
    assert saved_steps(manager) == [2, 4]  # committed (in-flight saves were awaited), intact
    four = fit(fake_step, fake_state(), Loader(dataset(40), 4), duration="4ba")
    assert torch.equal(load(manager.latest())["params.w"], four.params["w"])


def test_callback_state_is_checkpointed_and_restored():
    class Counter:
        name = "counter"

        def __init__(self):
            self.batches = 0

        def batch_end(self, ctx):
            self.batches += 1

        def state_dict(self):
            return {"batches": self.batches}

        def load_state_dict(self, state):
            self.batches = int(state["batches"])

    manager = memory_manager(every=2)
    first = Counter()
    fit(fake_step, fake_state(), Loader(dataset(40), 4), duration="5ba", callbacks=[first],
        checkpoints=manager)  # fmt: skip
    saved = load(manager.latest())
    assert decode_state(saved["extra.callbacks.counter"]) == {"batches": 5}
    second = Counter()
    state = fit(fake_step, fake_state(), Loader(dataset(40), 4), duration="7ba",
                callbacks=[second], checkpoints=manager, autoresume=True)  # fmt: skip
    assert second.batches == 7 and state.timestamp.batch == 7


def test_dispatch_calls_only_defined_methods_in_order():
    calls = []

    class A:
        def batch_end(self, ctx):
            calls.append("A")

    class B:
        name = "bee"

        def batch_end(self, ctx):
            calls.append("B")

    ctx = Context()
    dispatch(Event.BATCH_END, [A(), object(), B()], ctx)
    dispatch(Event.EPOCH_END, [A(), B()], ctx)
    assert calls == ["A", "B"] and ctx.event is Event.EPOCH_END
    assert callback_name(B()) == "bee" and callback_name(A()) == "A"
    assert unique_names([A(), A(), B()]) == ["A", "A#2", "bee"]


def test_ctx_log_flattens_to_floats_for_loggers():
    class Logger:
        def __init__(self):
            self.calls = []

        def log_metrics(self, metrics, step):
            self.calls.append((metrics, step))

    logger = Logger()
    ctx = Context(loggers=[logger], state=fake_state())
    ctx.log({"loss": torch.tensor(0.25), "g": {"a": 2}, "out": torch.zeros(3), "lr": None}, step=4)
    assert logger.calls == [({"loss": 0.25, "g/a": 2.0}, 4)]
    assert scalar_metrics({"x": torch.tensor([1.5]), "ok": True}) == {"x": 1.5}


def test_state_encoding_round_trips_and_rejects_objects():
    value = {"best": None, "hist": [1.5, float("inf")], "t": torch.arange(6).reshape(2, 3),
             "b": torch.tensor([1.0], dtype=torch.bfloat16), "name": "x", "pair": (1, 2)}  # fmt: skip
    back = decode_state(encode_state(value))
    assert back["best"] is None and back["hist"] == [1.5, float("inf")] and back["name"] == "x"
    assert torch.equal(back["t"], value["t"]) and back["b"].dtype == torch.bfloat16
    assert back["pair"] == [1, 2]
    with pytest.raises(TypeError, match=r"cb.state_dict\(\).obj is a object"):
        encode_state({"obj": object()}, "cb.state_dict()")
    with pytest.raises(TypeError, match="dict keys must be strings"):
        encode_state({1: 2})
