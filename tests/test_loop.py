"""Tests of functrain.loop: fit (durations, continuation, resume, SIGTERM, logging, bad input);
evaluate and predict are tested in test_evaluation.py. Checkpoints go through real
`functrain.checkpoint.Manager`s (in memory, or in a tmp dir); the subprocess tests at the end kill
real runs. Multi-state fit, preemption under the launcher and Ctrl-C: test_fit_multi.py and
test_preemption.py."""

import os
import signal
import uuid

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import functrain
from functrain.checkpoint import Manager, load
from functrain.data import Loader
from functrain.loop import StepError, evaluate, fit
from functrain.loop.events import CallbackError
from functrain.tree import tree_allclose

# -- helpers ---------------------------------------------------------------------------------


def regression_data(n=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(n, generator=gen)
    return TensorDataset(x, y[:, None])


def mse_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def regression_run(seed=0):
    """A fresh (step, state) for a linear model trained with AdamW."""
    torch.manual_seed(seed)
    model = nn.Linear(3, 1)
    opt = functrain.optim.adamw(lr=0.1)
    return functrain.make_step(model, mse_loss, opt), functrain.init(model, opt, seed=seed)


def count_step(state, batch):
    """A pure fake step that counts 2 tokens per sample."""
    x = batch[0]
    new = state.replace(
        step=state.step + 1,
        params={"w": state.params["w"] + x.sum()},
        timestamp=state.timestamp.advance_batch(samples=x.shape[0], tokens=2 * x.shape[0]),
    )
    return new, {"loss": x.mean()}


def fake_state():
    return functrain.TrainState(
        step=0, params={"w": torch.zeros(())}, buffers={}, opt_state=(), rng=functrain.RngState(0)
    )


def memory_manager(every=None):
    """A real checkpoint Manager on a fresh in-memory store, keeping every checkpoint."""
    return Manager(f"memory://test_loop/{uuid.uuid4().hex}", every=every, keep_last=None)


def saved_steps(manager):
    """The steps of the committed checkpoints, oldest first."""
    return [step for step, _ in manager.checkpoints()]


class StopAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            ctx.request_stop(f"stop at {self.batch}")


# -- fit -------------------------------------------------------------------------------------


def test_fit_trains_and_sets_the_horizon():
    step, state = regression_run()
    data = regression_data()
    before = evaluate(step, state, Loader(data, 48, shuffle=False))["loss"]
    state = fit(step, state, Loader(data, 8, seed=0), duration="3ep")
    after = evaluate(step, state, Loader(data, 48, shuffle=False))["loss"]
    assert after < 0.3 * before
    ts = state.timestamp
    assert (ts.epoch, ts.batch, ts.batch_in_epoch) == (3, 18, 0)
    assert (ts.batches_per_epoch, ts.max_batches, ts.sample) == (6, 18, 144)
    assert ts.elapsed_sec > 0 and state.step == 18


@pytest.mark.parametrize(
    "duration, batches",
    [("7ba", 7), ("2ep", 10), ("0.5ep", 3), ("40sp", 5), ("30tok", 2), (9, 9)],
)
def test_durations_in_every_unit(duration, batches):
    # 40 samples, batch 8: 5 batches per epoch, 16 tokens per batch (count_step).
    data = TensorDataset(torch.ones(40, 1))
    state = fit(count_step, fake_state(), Loader(data, 8), duration=duration)
    assert state.timestamp.batch == batches


def test_wall_clock_duration_stops():
    def slow_step(state, batch):
        import time

        time.sleep(0.02)
        return count_step(state, batch)

    state = fit(slow_step, fake_state(), Loader(TensorDataset(torch.ones(40, 1)), 8),
                duration="0.1sec")  # fmt: skip
    assert state.timestamp.elapsed_sec >= 0.1 and state.timestamp.batch >= 1


def test_continuing_fit_equals_one_run():
    data = regression_data()
    step, state = regression_run()
    once = fit(step, state, Loader(data, 8, seed=3), duration="3ep")
    step, state = regression_run()
    state = fit(step, state, Loader(data, 8, seed=3), duration="1ep")
    twice = fit(step, state, Loader(data, 8, seed=3), duration="3ep")
    assert tree_allclose(once.params, twice.params) and tree_allclose(
        once.opt_state, twice.opt_state
    )
    # a state that already reached its duration returns at once
    again = fit(step, twice, Loader(data, 8, seed=3), duration="3ep")
    assert again.timestamp.batch == 18


def test_mid_epoch_resume_is_bit_identical():
    data = regression_data()
    step, state = regression_run()
    full = fit(step, state, Loader(data, 8, seed=1), duration="2ep")
    manager = memory_manager()
    step, state = regression_run()
    stopped = fit(step, state, Loader(data, 8, seed=1), duration="2ep", callbacks=[StopAt(8)],
                  checkpoints=manager)  # fmt: skip
    assert stopped.timestamp.batch == 8 and stopped.timestamp.batch_in_epoch == 2
    assert saved_steps(manager) == [8]
    step, state = regression_run(seed=5)  # different init: everything comes from the checkpoint
    resumed = fit(step, state, Loader(data, 8, seed=1), duration="2ep", checkpoints=manager,
                  autoresume=True)  # fmt: skip
    assert tree_allclose(full.params, resumed.params)
    assert tree_allclose(full.opt_state, resumed.opt_state)
    assert resumed.timestamp.batch == 12


def test_checkpoints_as_a_directory_save_and_resume(tmp_path):
    data = regression_data()
    step, state = regression_run()
    full = fit(step, state, Loader(data, 8, seed=1), duration="2ep")
    step, state = regression_run()
    fit(step, state, Loader(data, 8, seed=1), duration="1ep", checkpoints=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["step_000000006"]
    step, state = regression_run()
    resumed = fit(step, state, Loader(data, 8, seed=1), duration="2ep", checkpoints=tmp_path,
                  autoresume=True)  # fmt: skip
    assert tree_allclose(full.params, resumed.params)
    assert sorted(os.listdir(tmp_path)) == ["step_000000006", "step_000000012"]


def test_replay_fallback_resume_matches_for_plain_iterables():
    data = regression_data(24)
    batches = [data[i : i + 6] for i in range(0, 24, 6)]  # a plain list: resumes by replay
    step, state = regression_run()
    full = fit(step, state, batches, duration="2ep")
    manager = memory_manager()
    step, state = regression_run()
    fit(step, state, batches, duration="2ep", callbacks=[StopAt(6)], checkpoints=manager)
    step, state = regression_run()
    with pytest.warns(UserWarning, match="replaying"):
        resumed = fit(step, state, batches, duration="2ep", checkpoints=manager, autoresume=True)
    assert tree_allclose(full.params, resumed.params)


def test_sigterm_checkpoints_at_the_step_boundary_and_returns():
    class Preempt:
        def batch_end(self, ctx):
            if ctx.timestamp.batch == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        def fit_end(self, ctx):
            self.reason = ctx.stop_reason

    previous = signal.getsignal(signal.SIGTERM)
    manager, preempt = memory_manager(), Preempt()
    result = fit(count_step, fake_state(), Loader(TensorDataset(torch.ones(40, 1)), 8),
                 duration="3ep", callbacks=[preempt], checkpoints=manager,
                 return_result=True)  # fmt: skip
    assert result.state.timestamp.batch == 3 and "SIGTERM" in preempt.reason
    assert saved_steps(manager) == [3]
    assert result.preempted and result.signal == "SIGTERM" and result.exit_code == 75
    assert not result.finished and result.checkpoint == manager.latest()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_eval_intervals_logging_and_several_eval_sets():
    class Logger:
        def __init__(self):
            self.steps = {}

        def log_metrics(self, metrics, step):
            for key in metrics:
                self.steps.setdefault(key, []).append(step)

    logger = Logger()
    step, state = regression_run()
    data = regression_data()
    fit(
        step,
        state,
        Loader(data, 8),
        duration="2ep",
        eval_data={"a": Loader(data, 16, shuffle=False), "b": [data[:4]]},
        eval_interval="0.25dur",
        eval_metrics=None,
        loggers=[logger],
        log_interval="4ba",
    )
    assert logger.steps["train/loss"] == [4, 8, 12]
    assert logger.steps["eval/a/loss"] == [3, 6, 9, 12] == logger.steps["eval/b/loss"]


def test_an_epoch_log_interval_logs_the_last_batch_of_each_epoch():
    class Logger:
        def __init__(self):
            self.steps = []

        def log_metrics(self, metrics, step):
            self.steps.append((sorted(metrics), step))

    class NoLength:  # its epoch length is learnt only when the first epoch runs out
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            return iter(self.batches)

    batches = [(torch.ones(2, 1),) for _ in range(3)]
    for data, interval, expected in [
        (batches, "1ep", [3, 6, 9, 12]),
        (NoLength(batches), "1ep", [3, 6, 9, 12]),
        (NoLength(batches), "2ep", [6, 12]),
        (Loader(TensorDataset(torch.ones(6, 1)), 2), "1ep", [3, 6, 9, 12]),
    ]:
        logger = Logger()
        fit(count_step, fake_state(), data, duration="4ep", log_interval=interval,
            loggers=[logger])  # fmt: skip
        assert logger.steps == [(["train/loss"], step) for step in expected], (data, interval)


def test_eval_state_fn_chooses_the_weights_evaluated():
    seen = []

    def zero_weights(state):
        seen.append(state.timestamp.batch)
        return state.replace(params={k: torch.zeros_like(v) for k, v in state.params.items()})

    class Grab:
        def eval_end(self, ctx):
            self.loss = ctx.eval_metrics["loss"]

    step, state = regression_run()
    data = regression_data()
    grab = Grab()
    state = fit(step, state, Loader(data, 8), duration="1ep", eval_data=Loader(data, 48),
                eval_state_fn=zero_weights, callbacks=[grab])  # fmt: skip
    x, y = data.tensors
    assert seen == [6] and grab.loss == pytest.approx(float((y**2).mean()), rel=1e-5)
    assert not all(bool((v == 0).all()) for v in state.params.values())  # training untouched


def test_fit_passes_batches_and_metrics_of_a_dict_batch_model():
    class DictModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 1)

        def forward(self, features):
            return self.lin(features)

    def loss_fn(model, batch):
        return F.mse_loss(model(batch["features"]), batch["target"])

    torch.manual_seed(0)
    model = DictModel()
    opt = functrain.optim.sgd(lr=0.1)
    step, state = functrain.make_step(model, loss_fn, opt), functrain.init(model, opt)
    batches = [{"features": torch.randn(4, 2), "target": torch.randn(4, 1)} for _ in range(3)]
    state = fit(step, state, batches, duration="2ep", eval_data=batches)
    assert state.timestamp.batch == 6
    with pytest.raises(ValueError, match="cannot take the targets"):
        evaluate(step, state, batches, metrics=["accuracy"])


# -- bad input -------------------------------------------------------------------------------


def test_bad_durations_and_intervals_name_the_argument():
    loader = Loader(TensorDataset(torch.ones(8, 1)), 4)
    with pytest.raises(ValueError, match=r"fit\(duration='3epochs'\).*accepted forms"):
        fit(count_step, fake_state(), loader, duration="3epochs")
    with pytest.raises(ValueError, match="cannot be a fraction of itself"):
        fit(count_step, fake_state(), loader, duration="0.5dur")
    with pytest.raises(ValueError, match=r"fit\(eval_interval='often'\)"):
        fit(count_step, fake_state(), loader, duration="1ep", eval_interval="often")
    with pytest.raises(ValueError, match="must be positive"):
        fit(count_step, fake_state(), loader, duration="0ba")
    with pytest.raises(ValueError, match="needs a known run length"):
        fit(count_step, fake_state(), loader, duration="1sec", eval_interval="0.5dur")


def test_empty_and_one_shot_data_are_rejected():
    with pytest.raises(ValueError, match="empty"):
        fit(count_step, fake_state(), [], duration="1ep")
    one_shot = (b for b in [(torch.ones(2, 1),)] * 2)
    with pytest.raises(ValueError, match="one-shot iterator"):
        fit(count_step, fake_state(), one_shot, duration="2ep")
    with pytest.raises(TypeError, match="re-iterable"):
        fit(count_step, fake_state(), 5, duration="1ep")


def test_a_batch_the_loss_cannot_consume_names_the_batch():
    step, state = regression_run()
    bad = [(torch.zeros(4, 5), torch.zeros(4, 1))]  # 5 features for a Linear(3, 1)
    with pytest.raises(StepError, match=r"batch 0 of epoch 0.*Tensor\[4, 5\] float32") as info:
        fit(step, state, bad, duration="1ep")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_wrong_arguments_are_explained():
    loader = Loader(TensorDataset(torch.ones(8, 1)), 4)
    with pytest.raises(ValueError, match=r"autoresume=True\) needs checkpoints"):
        fit(count_step, fake_state(), loader, duration="1ep", autoresume=True)
    with pytest.raises(TypeError, match="no log_metrics"):
        fit(count_step, fake_state(), loader, duration="1ep", loggers=[object()])
    with pytest.raises(TypeError, match="takes a functrain.checkpoint.Manager or a directory"):
        fit(count_step, fake_state(), loader, duration="1ep", checkpoints=object())
    with pytest.raises(TypeError, match="returned a dict for a TrainState"):
        fit(lambda state, batch: ({"w": 1}, {}), fake_state(), loader, duration="1ep")
    with pytest.raises(TypeError, match="metrics a dict"):
        fit(lambda state, batch: (state, 1.0), fake_state(), loader, duration="1ep")
    with pytest.raises(TypeError, match="a step must be callable"):
        fit("step", fake_state(), loader, duration="1ep")


def test_a_failing_callback_leaves_earlier_checkpoints_intact():
    class FailAt5:
        def batch_end(self, ctx):
            if ctx.timestamp.batch == 5:
                raise RuntimeError("disk full")

    data = regression_data()
    manager = memory_manager(every="2ba")
    step, state = regression_run()
    with pytest.raises(CallbackError, match="FailAt5"):
        fit(step, state, Loader(data, 8), duration="2ep", callbacks=[FailAt5()],
            checkpoints=manager)  # fmt: skip
    assert saved_steps(manager) == [2, 4]  # committed: fit waited for the save in flight
    step, state = regression_run()
    four = fit(step, state, Loader(data, 8), duration="4ba")
    saved = load(manager.latest())
    assert all(torch.equal(saved[f"params.{k}"], v) for k, v in four.params.items())


# -- several processes --------------------------------------------------------------------------


def _stop_on_one_rank(rank: int, port: int, out: str) -> None:
    """Worker: two gloo ranks; only rank 0 asks to stop (at batch 3)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        callbacks = [StopAt(3)] if rank == 0 else []
        state = fit(count_step, fake_state(), Loader(TensorDataset(torch.ones(40, 1)), 8),
                    duration="2ep", callbacks=callbacks)  # fmt: skip
        with open(out, "w") as f:
            f.write(f"{state.timestamp.batch} {state.timestamp.sample}")
    finally:
        # functrain's teardown, not torch's destroy_process_group: before torch 2.8 that one can
        # deadlock right after a collective (functrain._torch.group_backends; 1 run in 20 on 2.6)
        functrain.parallel.shutdown()


@pytest.mark.slow
def test_a_stop_on_one_rank_stops_every_rank(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    f"import sys; sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]; import test_loop; "
                    f"test_loop._stop_on_one_rank({rank}, {port}, {str(tmp_path / str(rank))!r})"
                ),
            ]
        )  # fmt: skip
        for rank in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    # Both stopped at the same batch (no functrain mesh here, so each rank loads whole batches of
    # 8): the request of batch 3 travels in the agreement started at batch 4 (the cadence's second,
    # FIRST_PERIOD batches after FIT_START's) and read at batch 5, after its step was dispatched.
    assert [(tmp_path / str(r)).read_text() for r in range(2)] == ["5 40", "5 40"]


# -- preemption with real checkpoints (subprocesses) -----------------------------------------

PREEMPT_DURATION = "6ep"


def _preemptible_setup():
    """The run the preemption test kills: a small MLP, AdamW, shuffled data, 36 steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = functrain.optim.adamw(lr=0.02)
    step = functrain.make_step(model, mse_loss, opt)
    return step, functrain.init(model, opt, seed=0), Loader(regression_data(), 8, seed=7)


def _preemptible_run(root: str, started: str, out: str) -> None:
    """Worker: train with auto-resume, saving every batch; write the final params to `out`."""
    import time

    from safetensors.torch import save_file

    from functrain.checkpoint import Manager

    torch.set_num_threads(1)

    class Pace:  # slows the run down so that kills land during steps and during saves
        def fit_start(self, ctx):
            open(started, "w").close()

        def batch_end(self, ctx):
            time.sleep(0.03)

    step, state, loader = _preemptible_setup()
    with Manager(root, every="1ba", keep_last=2) as manager:
        state = fit(step, state, loader, duration=PREEMPT_DURATION, callbacks=[Pace()],
                    checkpoints=manager, autoresume=True)  # fmt: skip
    done = state.timestamp.batch == 36
    save_file({k: v.contiguous() for k, v in state.params.items()}, out + (".done" if done else ""))


@pytest.mark.slow
def test_sigterm_and_sigkill_at_random_points_resume_bit_identically(tmp_path):
    import random
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    from functrain.checkpoint import Manager

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step, state, loader = _preemptible_setup()
        reference = fit(step, state, loader, duration=PREEMPT_DURATION)
    finally:
        torch.set_num_threads(threads)

    here = os.path.dirname(os.path.abspath(__file__))
    root, started, out = tmp_path / "ckpt", tmp_path / "started", tmp_path / "params"
    code = (
        f"import sys; sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]; import test_loop; "
        f"test_loop._preemptible_run({str(root)!r}, {str(started)!r}, {str(out)!r})"
    )
    rng = random.Random(1234)
    plan = ["SIGTERM", "SIGKILL", "SIGKILL", None]  # the last run goes to the end
    for signal_name in plan:
        started.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", code])
        if signal_name is not None:
            deadline = time.monotonic() + 120
            while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(getattr(signal, signal_name))
        rc = proc.wait(timeout=180)
        if signal_name == "SIGTERM":
            assert rc == 0  # checkpointed at the step boundary and returned cleanly
            last = load_file(str(out))
            with Manager(root, keep_last=2) as manager:
                saved = functrain.checkpoint.load(manager.latest())
            for name, value in last.items():
                assert torch.equal(saved[f"params.{name}"], value)  # the state it stopped at
        elif signal_name == "SIGKILL":
            assert rc == -signal.SIGKILL or (out.with_suffix(".done")).exists()
        else:
            assert rc == 0
        # the newest committed checkpoint always loads (checksums verified on read)
        with Manager(root, keep_last=2) as manager:
            if manager.latest() is not None:
                functrain.checkpoint.load(
                    manager.latest(), like=_preemptible_setup()[1], ignore="extra"
                )
    final = load_file(str(tmp_path / "params.done"))
    for name, value in reference.params.items():
        assert torch.equal(final[name], value), name


# -- train metrics, evaluation options, run directory ----------------------------------------


def classification(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


class CountingLinear(nn.Linear):
    calls = 0

    def forward(self, x):
        CountingLinear.calls += 1
        return super().forward(x)


def test_train_metrics_come_from_the_steps_outputs_over_each_log_window():
    class Keep:  # what the step saw: its outputs and the batch's targets, per batch
        def __init__(self):
            self.seen, self.logged = [], {}

        def batch_end(self, ctx):
            self.seen.append((ctx.metrics["outputs"], ctx.batch[1]))

        def log_metrics(self, metrics, step):
            if "train/accuracy" in metrics:
                self.logged[step] = metrics["train/accuracy"]

    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits, y), {"outputs": logits}

    torch.manual_seed(0)
    model = CountingLinear(4, 3)
    opt = functrain.optim.sgd(lr=0.5)
    step, state = functrain.make_step(model, loss_fn, opt), functrain.init(model, opt)
    keep = Keep()
    CountingLinear.calls = 0
    fit(step, state, Loader(classification(), 4, seed=0), duration="6ba", log_interval="3ba",
        train_metrics=["accuracy"], loggers=[keep], progress=False)  # fmt: skip
    assert CountingLinear.calls == 6  # one forward per batch: no extra pass for the metrics
    for end in (3, 6):  # each logged value covers the batches since the previous log
        window = keep.seen[end - 3 : end]
        correct = sum(int((o.argmax(-1) == y).sum()) for o, y in window)
        assert keep.logged[end] == pytest.approx(correct / sum(len(y) for _, y in window))
    assert sorted(keep.logged) == [3, 6]
    plain = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), opt)
    with pytest.raises(ValueError, match=r"return loss, \{'outputs': logits\}"):
        fit(plain, functrain.init(model, opt), Loader(classification(), 4), duration="1ba",
            train_metrics=["accuracy"], progress=False)  # fmt: skip


def test_fits_input_and_target_keys_match_evaluates():
    def loss_fn(model, batch):
        return F.cross_entropy(model(batch["x"]), batch["y"])

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = functrain.optim.sgd(lr=0.1)
    step, state = functrain.make_step(model, loss_fn, opt), functrain.init(model, opt)
    x, y = classification().tensors
    batches = [{"x": x[i : i + 8], "y": y[i : i + 8]} for i in range(0, 32, 8)]
    got = []

    class Grab:
        def eval_end(self, ctx):
            got.append(ctx.eval_metrics["accuracy"])

    state = fit(step, state, batches, duration="1ep", eval_data=batches, eval_metrics=["accuracy"],
                input_key="x", target_key="y", callbacks=[Grab()], progress=False)  # fmt: skip
    logits = x @ state.params["weight"].T + state.params["bias"]
    assert got == [pytest.approx(float((logits.argmax(-1) == y).float().mean()))]


def test_an_evaluation_set_without_batches_is_an_error_not_nan():
    class Nothing:  # no length: found empty when evaluated
        def __iter__(self):
            return iter(())

    class Count:
        batches = 0

        def batch_end(self, ctx):
            Count.batches += 1

    loader = Loader(TensorDataset(torch.ones(8, 1)), 4)
    with pytest.raises(ValueError, match=r"eval_data yields no batch.*NaN"):
        fit(count_step, fake_state(), loader, duration="2ba", eval_data=[], callbacks=[Count()],
            progress=False)  # fmt: skip
    assert Count.batches == 0  # a set with a length of 0 fails before training
    with pytest.raises(ValueError, match=r"eval_data\['val'\] yields no batch"):
        fit(count_step, fake_state(), loader, duration="2ba", eval_data={"val": Nothing()},
            eval_fn=lambda m, b: (b, b), progress=False)  # fmt: skip


def test_run_dir_gets_metrics_jsonl_that_plot_draws(tmp_path):
    from functrain.loggers import read_metrics
    from functrain.plot import plot_run

    step, state = regression_run()
    data = regression_data()
    fit(step, state, Loader(data, 8), duration="2ep", eval_data=Loader(data, 48),
        log_interval="2ba", run_dir=tmp_path, progress=False)  # fmt: skip
    series = read_metrics(tmp_path / "metrics.jsonl")
    assert [s for s, _ in series["train/loss"]] == [2, 4, 6, 8, 10, 12]
    assert [s for s, _ in series["eval/loss"]] == [6, 12]
    assert plot_run(tmp_path).exists()


# -- the one copy of the state, and what fit says ---------------------------------------------


def test_ctx_state_is_the_loops_one_copy_and_read_only():
    class Check:
        def batch_end(self, ctx):
            with pytest.raises(AttributeError, match="cannot be replaced"):
                ctx.state = fake_state()
            self.last = ctx.state

        def fit_end(self, ctx):
            self.end = ctx.state

    check = Check()
    state = fit(count_step, fake_state(), Loader(TensorDataset(torch.ones(8, 1)), 4),
                duration="2ba", callbacks=[check], progress=False)  # fmt: skip
    assert check.end is state and check.last.timestamp.batch == 2


def test_fit_says_where_it_resumed_and_that_a_run_had_finished(capfd):
    manager = memory_manager(every="2ba")
    data = Loader(TensorDataset(torch.ones(16, 1)), 4)
    fit(count_step, fake_state(), data, duration="3ba", checkpoints=manager)
    assert "stopped" not in capfd.readouterr().err  # finished: no "stopped" line
    fit(count_step, fake_state(), data, duration="3ba", checkpoints=manager, autoresume=True)
    err = capfd.readouterr().err
    assert f"resumed from {manager.latest()} at step 3 (epoch 0, batch 3)" in err
    assert "run already finished at step 3" in err
    fit(count_step, fake_state(), data, duration="3ba", checkpoints=manager, autoresume=True,
        progress=False)  # fmt: skip
    assert capfd.readouterr().err == ""
