"""Callbacks and loggers in real `functrain.fit` runs on scikit-learn's digits.

(TorchProfiler has its own test with a real step: its start-up costs seconds.)
"""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

import functrain
from functrain.callbacks import (
    EarlyStopper,
    ImageVisualizer,
    LRMonitor,
    MemoryMonitor,
    NaNMonitor,
    NonFiniteError,
    OptimizerMonitor,
    RuntimeEstimator,
    SpeedMonitor,
    ThresholdStopper,
)
from functrain.data import Loader
from functrain.loggers import ConsoleLogger, JSONLLogger, ProgressBar, TensorBoardLogger
from functrain.loop import fit
from functrain.loop.events import CallbackError
from functrain.plot import plot_run


class Digits(torch.utils.data.Dataset):
    def __init__(self, images, targets):
        self.images, self.targets = images, targets

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], self.targets[index]


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0
    targets = torch.tensor(data.target)
    return Digits(images[:512], targets[:512]), Digits(images[1500:1628], targets[1500:1628])


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )


def _loss(model, batch):
    images, targets = batch
    logits = model(images)
    return torch.nn.functional.cross_entropy(logits, targets), {"outputs": logits}


def _setup(lr=0.05):
    model = _model()
    opt = functrain.optim.adamw(lr=lr)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, _loss, opt, report_grad_norms=True)
    return step, state


def test_all_callbacks_and_loggers_in_a_run(digits, tmp_path):
    train, val = digits
    step, state = _setup()
    console, bar_out = io.StringIO(), io.StringIO()
    viz = ImageVisualizer(interval="1ep", on_eval=True, predict_fn=step.pieces.call_model)
    state = fit(
        step,
        state,
        Loader(train, 64, seed=0),
        duration="2ep",
        eval_data=Loader(val, 64, shuffle=False, drop_last=False),
        eval_metrics=["accuracy"],
        log_interval="4ba",
        run_dir=tmp_path,
        callbacks=[
            LRMonitor(),
            SpeedMonitor(window_size=5),
            MemoryMonitor(),
            RuntimeEstimator(),
            NaNMonitor(),
            EarlyStopper("accuracy", patience=5),
            OptimizerMonitor(group_by=1),
            viz,
        ],
        loggers=[
            JSONLLogger(),
            TensorBoardLogger(),
            ConsoleLogger(stream=console),
            ProgressBar(enabled=True, stream=bar_out),
        ],
    )
    assert state.timestamp.batch == 16
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    for key in [
        "train/loss", "lr", "throughput/samples_per_sec", "memory/cpu_rss_gib",
        "time/remaining_estimate", "l2_norm/grad/1", "l2_norm/param/3", "eval/accuracy",
    ]:  # fmt: skip
        assert key in keys, key
    assert {r["step"] for r in rows} == {4, 8, 12, 16}  # logging steps (and evals at 8, 16)
    accuracy = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(accuracy) == 2 and accuracy[-1] > 0.6  # it learnt something
    samples_per_sec = [
        r["throughput/samples_per_sec"] for r in rows if "throughput/samples_per_sec" in r
    ]
    assert all(s > 0 for s in samples_per_sec)
    assert "[step 16]" in console.getvalue() and "eval/accuracy" in console.getvalue()
    assert "16/16" in bar_out.getvalue()
    assert {p.name for p in viz.written} >= {"images_train_step00000008.png"}
    assert any(p.name.startswith("images_eval") for p in viz.written)
    assert list((tmp_path / "tensorboard").iterdir())
    assert plot_run(tmp_path).stat().st_size > 20_000


def test_threshold_stopper_ends_the_run_early(digits):
    train, val = digits
    step, state = _setup()
    stopper = ThresholdStopper("accuracy", 0.0)  # reached at the first evaluation
    state = fit(
        step, state, Loader(train, 64), duration="5ep", eval_data=Loader(val, 64),
        eval_interval="4ba", eval_metrics=["accuracy"], callbacks=[stopper],
    )  # fmt: skip
    assert stopper.reached_at == 4 and state.timestamp.batch == 4


def test_nan_monitor_stops_the_run_naming_the_step(digits):
    train, _ = digits
    step, state = _setup()
    batches = [(train.images[i : i + 32], train.targets[i : i + 32]) for i in range(0, 192, 32)]
    poisoned = batches[2][0].clone()
    poisoned[0, 0, 0, 0] = math.nan
    batches[2] = (poisoned, batches[2][1])
    with pytest.raises(CallbackError, match="NaNMonitor") as error:
        fit(step, state, batches, duration="6ba", log_interval="5ba", callbacks=[NaNMonitor()])
    assert isinstance(error.value.__cause__, NonFiniteError)
    assert "'loss' is nan at step 3" in str(error.value)
