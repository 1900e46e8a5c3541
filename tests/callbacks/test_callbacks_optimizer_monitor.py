"""OptimizerMonitor: per-group gradient and parameter norms, from a real step."""

from __future__ import annotations

import math

import pytest
import torch

import functrain
from functrain.callbacks import OptimizerMonitor, group_of


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.fixture
def trained_ctx(make_ctx, recorder, tiny_state):
    """A context after one real step with per-parameter gradient norms reported."""
    state = tiny_state()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    step = functrain.make_step(model, _loss, functrain.optim.sgd(lr=0.1), report_grad_norms=True)
    batch = (torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)
    grads = torch.func.grad(
        lambda p: _loss(lambda x: torch.func.functional_call(model, p, (x,)), batch)
    )(dict(state.params))
    ctx = make_ctx(state, loggers=[recorder])
    ctx.state, ctx.metrics = step(state, batch)
    return ctx, grads


def test_group_norms_match_a_direct_computation(trained_ctx, recorder):
    ctx, grads = trained_ctx
    OptimizerMonitor().batch_end(ctx)
    values = recorder.calls[-1][1]
    for group in ("0", "2"):
        expected = math.sqrt(
            sum(float(g.square().sum()) for k, g in grads.items() if k[0] == group)
        )
        assert values[f"l2_norm/grad/{group}"] == pytest.approx(expected, rel=1e-5)
        params = ctx.state.params
        expected = math.sqrt(
            sum(float(p.square().sum()) for k, p in params.items() if k[0] == group)
        )
        assert values[f"l2_norm/param/{group}"] == pytest.approx(expected, rel=1e-5)
    total = math.sqrt(values["l2_norm/grad/0"] ** 2 + values["l2_norm/grad/2"] ** 2)
    assert values["l2_norm/grad/global"] == pytest.approx(total, rel=1e-5)
    total = math.sqrt(values["l2_norm/param/0"] ** 2 + values["l2_norm/param/2"] ** 2)
    assert values["l2_norm/param/global"] == pytest.approx(total, rel=1e-5)


def test_group_by_parameter(trained_ctx, recorder):
    ctx, grads = trained_ctx
    OptimizerMonitor(group_by="param", log_param_norms=False).batch_end(ctx)
    values = recorder.calls[-1][1]
    assert sorted(values) == sorted(
        ["l2_norm/grad/global"] + [f"l2_norm/grad/{name}" for name in grads]
    )
    assert values["l2_norm/grad/2.bias"] == pytest.approx(float(grads["2.bias"].norm()), rel=1e-5)


def test_without_per_parameter_norms_warns_once(make_ctx, advance, recorder):
    ctx = make_ctx(loggers=[recorder])
    monitor = OptimizerMonitor()
    with pytest.warns(UserWarning, match="report_grad_norms=True"):
        monitor.batch_end(advance(ctx, grad_norm=torch.tensor(3.0)))
    monitor.batch_end(advance(ctx, grad_norm=torch.tensor(4.0)))  # no second warning
    values = recorder.calls[-1][1]
    assert values["l2_norm/grad/global"] == 4.0
    assert "l2_norm/param/0" in values and "l2_norm/grad/0" not in values


def test_only_on_logging_steps_and_one_host_read(make_ctx, advance, recorder, counting):
    ctx = make_ctx(loggers=[recorder], log_interval="3ba")
    monitor = OptimizerMonitor(log_param_norms=False)
    for _ in range(3):
        norms = {"0.weight": counting(3.0), "0.bias": counting(4.0), "2.weight": counting(1.0)}
        monitor.batch_end(advance(ctx, grad_norm=counting(5.1), grad_norms=norms))
        if ctx.timestamp.batch < 3:
            assert counting.reads == []
    assert counting.reads == ["tolist"]
    assert recorder.calls[-1][1]["l2_norm/grad/0"] == pytest.approx(5.0)


def test_group_of():
    assert group_of("encoder.layers.0.weight", "module") == "encoder.layers.0"
    assert group_of("encoder.layers.0.weight", 2) == "encoder.layers"
    assert group_of("bias", "module") == "bias"
    assert group_of("a.b", lambda name: name.upper()) == "A.B"
    with pytest.raises(ValueError, match="group_by"):
        OptimizerMonitor(group_by="layer")


# Sharded parameters: a one-rank group cannot tell a shard's norm from the whole tensor's, so
# that test runs on 2 fsdp ranks against one process, through fit:
# tests/parallel/test_parallel_multirank.py::test_optimizer_monitor_reports_whole_tensor_norms_under_fsdp
