"""ActivationMonitor through fit: Composer's keys, values equal to statistics computed by hand from
the model's own forward pass, the interval, and one count per call with activation checkpointing
(recomputation in backward is not counted). The 2-rank case is in
tests/parallel/test_parallel_actckpt.py."""

import math

import pytest
import torch
from torch import nn

import functrain
from functrain.algorithms import activation_checkpointing
from functrain.callbacks import ActivationMonitor
from functrain.data import Loader


class Recorder:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append((step, dict(metrics)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), Block(), Block(), nn.Linear(5, 2))


def data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def mse(model, batch):
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


def run(monitor_cls=ActivationMonitor, algorithm=None, duration="1ba", interval="1ba", **kw):
    model = net()
    opt = functrain.optim.sgd(0.1)
    step = functrain.make_step(model, mse, opt, **kw)
    step = functrain.compose(step, algorithm) if algorithm else step
    recorder = Recorder()
    monitor = monitor_cls(model, interval=interval)
    functrain.fit(step, functrain.init(model, opt), Loader(data(), 8, seed=1), duration=duration,
                  callbacks=[monitor], loggers=[recorder], progress=False)  # fmt: skip
    return recorder, monitor


def by_hand(value: torch.Tensor) -> dict:
    rows = value.double().reshape(-1, value.shape[-1])
    kurt = []
    for row in rows.tolist():
        mean = sum(row) / len(row)
        m2 = sum((v - mean) ** 2 for v in row) / len(row)
        m4 = sum((v - mean) ** 4 for v in row) / len(row)
        kurt.append(m4 / m2**2)
    return {
        "max": float(rows.max()),
        "average": float(rows.mean()),
        "l2_norm": sum(math.sqrt(sum(v * v for v in row)) for row in rows.tolist()) / len(rows),
        "kurtosis": sum(kurt) / len(kurt),
    }


def first_batch():
    (x, _), *_ = Loader(data(), 8, seed=1)
    return x


def test_logs_composers_keys_with_the_values_of_the_forward_pass():
    recorder, _ = run()
    (step, metrics), *_ = [c for c in recorder.calls if any("activations/" in k for k in c[1])]
    model, x = net(), first_batch()
    with torch.no_grad():
        h0 = model[0](x)
        h1 = model[1](h0)
        expected = {"0_input.0": x, "0_output.0": h0, "1_output.0": h1, "_output.0": model(x)}
    for key, value in expected.items():
        for stat, number in by_hand(value).items():
            assert metrics[f"activations/{stat}/{key}"] == pytest.approx(number, rel=1e-9), (
                stat,
                key,
            )
    assert "activations/max/1.fc_input.0" in metrics


def test_logs_every_interval_from_the_first_batch():
    recorder, _ = run(duration="4ba", interval="2ba")
    logged = [step for step, m in recorder.calls if "activations/max/_output.0" in m]
    assert logged == [1, 3]  # batches 0 and 2 were due (Composer: batch % interval == 0)


class CountingMonitor(ActivationMonitor):
    """Keeps how many calls each key recorded on its last logged batch."""

    def batch_end(self, ctx):
        if self._stats:
            self.counts = {k: len(v) for k, v in self._stats.items()}
        super().batch_end(ctx)


def test_modules_recomputed_by_checkpointing_are_counted_once():
    plain, plain_monitor = run(CountingMonitor, microbatch_size=4)
    ckpt, ckpt_monitor = run(CountingMonitor, activation_checkpointing(Block), microbatch_size=4)
    assert plain_monitor.counts == ckpt_monitor.counts
    assert plain_monitor.counts["1.fc_output.0"] == 2  # two microbatches
    plain_metrics = [m for _, m in plain.calls if "activations/max/_output.0" in m]
    ckpt_metrics = [m for _, m in ckpt.calls if "activations/max/_output.0" in m]
    assert plain_metrics == ckpt_metrics


def test_ignored_module_types_are_not_watched():
    model = net()
    monitor = ActivationMonitor(model, ignore_module_types=["Linear", Block])
    assert [name for name, _ in monitor._watched()] == [""]
    with pytest.raises(TypeError, match="nn.Module"):
        ActivationMonitor(lambda x: x)
