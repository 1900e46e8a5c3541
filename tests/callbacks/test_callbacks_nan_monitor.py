"""NaNMonitor: records on the device every step, reads on checks, names the exact step."""

from __future__ import annotations

import math

import pytest
import torch

from functrain.callbacks import NaNMonitor, NonFiniteError


def _losses(values):
    return [torch.tensor(v) for v in values]


def test_names_the_step_the_loss_went_bad(make_ctx, advance):
    ctx = make_ctx(log_interval="10ba")
    monitor = NaNMonitor()
    losses = _losses([1.0, 0.9, 0.8, 0.7, math.nan, 0.5, math.nan, 0.4, 0.3])
    for loss in losses:
        monitor.batch_end(advance(ctx, loss=loss, grad_norm=torch.tensor(1.0)))
    with pytest.raises(NonFiniteError, match=r"'loss' is nan at step 5 \(epoch 0, batch 5"):
        monitor.batch_end(advance(ctx, loss=torch.tensor(0.2)))  # batch 10: the check


def test_earliest_metric_wins_and_inf_is_caught(make_ctx, advance):
    ctx = make_ctx(log_interval="4ba")
    monitor = NaNMonitor(action="stop")
    monitor.batch_end(advance(ctx, loss=torch.tensor(1.0), grad_norm=torch.tensor(1.0)))
    monitor.batch_end(advance(ctx, loss=torch.tensor(1.0), grad_norm=torch.tensor(math.inf)))
    monitor.batch_end(advance(ctx, loss=torch.tensor(math.nan), grad_norm=torch.tensor(1.0)))
    assert ctx.stop_reason is None
    monitor.batch_end(advance(ctx, loss=torch.tensor(1.0), grad_norm=torch.tensor(1.0)))
    assert "'grad_norm' is inf at step 2" in ctx.stop_reason
    assert "skip_nonfinite=True" in ctx.stop_reason  # the message says what to do


def test_no_host_read_between_checks(make_ctx, advance, counting):
    ctx = make_ctx(log_interval="5ba")
    monitor = NaNMonitor()
    for _ in range(4):
        monitor.batch_end(advance(ctx, loss=counting(1.0), grad_norm=counting(2.0)))
    assert counting.reads == []
    monitor.batch_end(advance(ctx, loss=counting(1.0), grad_norm=counting(2.0)))
    assert counting.reads == ["tolist"]  # one read of the whole record at the check


def test_checks_at_epoch_end_and_fit_end(make_ctx, advance):
    ctx = make_ctx(log_interval=None)  # the loop never logs: fall back to every 10 batches
    monitor = NaNMonitor(action="stop")
    monitor.batch_end(advance(ctx, loss=torch.tensor(math.nan)))
    assert ctx.stop_reason is None
    monitor.epoch_end(ctx)
    assert "step 1" in ctx.stop_reason


def test_vector_metrics_and_missing_keys(make_ctx, advance):
    ctx = make_ctx(log_interval="1ba")
    monitor = NaNMonitor(monitor=("per_class_loss", "absent"), action="stop")
    monitor.batch_end(advance(ctx, per_class_loss=torch.tensor([0.1, 0.2])))
    assert ctx.stop_reason is None
    monitor.batch_end(advance(ctx, per_class_loss=torch.tensor([0.1, -math.inf])))
    assert "'per_class_loss' is -inf at step 2" in ctx.stop_reason


def test_bad_action():
    with pytest.raises(ValueError, match="'raise' or 'stop'"):
        NaNMonitor(action="ignore")
