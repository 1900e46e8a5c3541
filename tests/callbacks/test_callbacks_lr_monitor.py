"""LRMonitor: the learning rate from the metrics or the optimizer state."""

from __future__ import annotations

import torch

import functrain
from functrain.callbacks import LRMonitor, learning_rates


def test_logs_the_steps_lr_on_logging_steps(make_ctx, advance, recorder):
    ctx = make_ctx(log_interval="2ba", loggers=[recorder])
    monitor = LRMonitor()
    for _ in range(5):
        monitor.batch_end(advance(ctx, lr=0.05))
    assert recorder.calls == [(2, {"lr": 0.05}), (4, {"lr": 0.05})]


def test_reads_the_optimizer_state_when_the_metrics_have_none(make_ctx, advance, recorder):
    model = torch.nn.Linear(3, 2)
    state = functrain.init(model, functrain.optim.adamw(lr=3e-4), seed=0)
    ctx = make_ctx(state, loggers=[recorder])
    advance(ctx)
    ctx.metrics.pop("lr")
    LRMonitor().batch_end(ctx)
    assert recorder.calls == [(1, {"lr": 3e-4})]


def test_several_rates_are_logged_by_path(make_ctx, advance, recorder, tiny_state):
    state = tiny_state().replace(opt_state={"body": {"lr": 0.1}, "head": {"lr": 0.01}})
    ctx = make_ctx(state, loggers=[recorder])
    advance(ctx, lr=None)
    LRMonitor().batch_end(ctx)
    assert recorder.calls == [(1, {"lr": 0.1, "lr/body.lr": 0.1, "lr/head.lr": 0.01})]


def test_learning_rates_ignores_tensors_and_other_leaves():
    state = {"lr": torch.tensor(0.1), "count": 3, "inner": {"learning_rate": 0.5}}
    assert learning_rates(state) == {"inner.learning_rate": 0.5}


def test_with_a_real_step_the_rate_follows_a_schedule(make_ctx, recorder):
    model = torch.nn.Linear(2, 1)
    opt = functrain.optim.sgd(lr=lambda t: 0.1 / (1 + (t if isinstance(t, int) else t.batch)))
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, lambda m, b: m(b[0]).pow(2).mean(), opt)
    ctx = make_ctx(state, loggers=[recorder])
    monitor = LRMonitor()
    for _ in range(3):
        ctx.state, ctx.metrics = step(ctx.state, (torch.ones(4, 2), None))
        monitor.batch_end(ctx)
    lrs = [metrics["lr"] for _, metrics in recorder.calls]
    assert len(lrs) == 3 and lrs[0] > lrs[1] > lrs[2]
