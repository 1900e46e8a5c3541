"""SpeedMonitor: windowed throughput, eval time left out, MFU, resumable wall clock."""

from __future__ import annotations

import pytest

from functrain.callbacks import SpeedMonitor, device_peak_flops
from functrain.callbacks import speed_monitor as speed_lib


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(speed_lib.time, "perf_counter", lambda: now[0])
    return now


def _run(monitor, ctx, advance, clock, batches, seconds=0.5, samples=8, tokens=0):
    for _ in range(batches):
        clock[0] += seconds
        monitor.batch_end(advance(ctx, samples=samples, tokens=tokens))


def test_rates_over_the_window(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder], world_size=2)
    monitor = SpeedMonitor(window_size=4, flops_per_sample=10.0, peak_flops=100.0)
    monitor.fit_start(ctx)
    _run(monitor, ctx, advance, clock, 6, seconds=0.5, samples=8, tokens=100)
    last = recorder.calls[-1][1]
    assert last["throughput/batches_per_sec"] == pytest.approx(2.0)
    assert last["throughput/samples_per_sec"] == pytest.approx(16.0)
    assert last["throughput/tokens_per_sec"] == pytest.approx(200.0)
    assert last["throughput/device/samples_per_sec"] == pytest.approx(8.0)
    assert last["throughput/flops_per_sec"] == pytest.approx(160.0)
    assert last["throughput/mfu"] == pytest.approx(160.0 / (100.0 * 2))
    assert last["wall_clock/train"] == pytest.approx(3.0)


def test_window_forgets_old_batches(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder])
    monitor = SpeedMonitor(window_size=3)
    monitor.fit_start(ctx)
    _run(monitor, ctx, advance, clock, 5, seconds=2.0)  # slow start
    _run(monitor, ctx, advance, clock, 3, seconds=0.25)  # then fast
    assert recorder.calls[-1][1]["throughput/samples_per_sec"] == pytest.approx(32.0)


def test_evaluation_time_is_not_training_time(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder])
    monitor = SpeedMonitor(window_size=10)
    monitor.fit_start(ctx)
    _run(monitor, ctx, advance, clock, 3, seconds=1.0)
    monitor.eval_start(ctx)
    clock[0] += 50.0
    monitor.eval_end(ctx)
    _run(monitor, ctx, advance, clock, 3, seconds=1.0)
    last = recorder.calls[-1][1]
    assert last["throughput/samples_per_sec"] == pytest.approx(8.0)
    assert last["wall_clock/train"] == pytest.approx(6.0)
    assert last["wall_clock/eval"] == pytest.approx(50.0)
    assert last["wall_clock/total"] == pytest.approx(56.0)


def test_flops_from_a_callable_of_the_batch(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder], world_size=1)
    ctx.batch = list(range(5))
    monitor = SpeedMonitor(window_size=5, flops_per_sample=lambda batch: 3.0 * len(batch))
    monitor.fit_start(ctx)
    _run(monitor, ctx, advance, clock, 5, seconds=1.0)
    last = recorder.calls[-1][1]
    assert last["throughput/flops_per_sec"] == pytest.approx(15.0)
    assert "throughput/mfu" not in last  # no peak known on CPU


def test_no_rate_before_two_batches(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder])
    monitor = SpeedMonitor()
    monitor.fit_start(ctx)
    _run(monitor, ctx, advance, clock, 1)
    assert not any(k.startswith("throughput/") for k in recorder.calls[0][1])


def test_wall_clock_survives_a_resume(make_ctx, advance, recorder, clock):
    ctx = make_ctx(loggers=[recorder])
    first = SpeedMonitor()
    first.fit_start(ctx)
    _run(first, ctx, advance, clock, 4, seconds=1.0)
    saved = first.state_dict()
    assert saved["train_sec"] == pytest.approx(4.0)
    second = SpeedMonitor()
    second.load_state_dict(saved)
    second.fit_start(ctx)
    _run(second, ctx, advance, clock, 2, seconds=1.0)
    assert recorder.calls[-1][1]["wall_clock/train"] == pytest.approx(6.0)


def test_peak_lookup_and_bad_window():
    assert device_peak_flops("cpu") is None
    with pytest.raises(ValueError, match="window_size"):
        SpeedMonitor(window_size=1)
