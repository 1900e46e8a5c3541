"""RuntimeEstimator: ETA from time per batch and the batches left."""

from __future__ import annotations

import pytest

from functrain.callbacks import RuntimeEstimator
from functrain.callbacks import runtime_estimator as eta_lib


@pytest.fixture
def clock(monkeypatch):
    now = [500.0]
    monkeypatch.setattr(eta_lib.time, "perf_counter", lambda: now[0])
    return now


def _ctx_with_horizon(make_ctx, recorder, max_batches, **kw):
    ctx = make_ctx(loggers=[recorder], **kw)
    ctx.state = ctx.state.replace(timestamp=ctx.state.timestamp.replace(max_batches=max_batches))
    return ctx


def test_remaining_time(make_ctx, advance, recorder, clock):
    ctx = _ctx_with_horizon(make_ctx, recorder, 100, log_interval="10ba")
    estimator = RuntimeEstimator(skip_batches=1)
    estimator.fit_start(ctx)
    clock[0] += 30.0  # the first batch: compilation, not representative
    estimator.batch_end(advance(ctx))
    for _ in range(9):
        clock[0] += 2.0
        estimator.batch_end(advance(ctx))
    assert recorder.calls == [
        (10, {"time/remaining_estimate": 180.0, "time/elapsed": 48.0, "time/progress": 0.1})
    ]


def test_time_unit_and_eval_overhead(make_ctx, advance, recorder, clock):
    ctx = _ctx_with_horizon(make_ctx, recorder, 40, log_interval="4ba")
    estimator = RuntimeEstimator(skip_batches=0, time_unit="minutes")
    estimator.fit_start(ctx)
    for batch in range(1, 5):
        clock[0] += 30.0 + (60.0 if batch == 2 else 0.0)  # an evaluation after batch 2
        estimator.batch_end(advance(ctx))
    # 4 batches took 180 s: 45 s each, eval included; 36 batches left -> 27 minutes.
    assert recorder.calls[-1][1]["time/remaining_estimate"] == pytest.approx(27.0)


def test_nothing_without_a_horizon(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder])
    estimator = RuntimeEstimator()
    estimator.fit_start(ctx)
    for _ in range(5):
        clock[0] += 1.0
        estimator.batch_end(advance(ctx))
    assert recorder.calls == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="time_unit"):
        RuntimeEstimator(time_unit="fortnights")
    with pytest.raises(ValueError, match="skip_batches"):
        RuntimeEstimator(skip_batches=-1)
