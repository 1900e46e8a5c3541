"""TorchProfiler: a Chrome trace of a window of real training steps."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import functrain
from functrain.callbacks import TorchProfiler


def _train(profiler, ctx, batches):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    step = functrain.make_step(
        model,
        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        functrain.optim.sgd(lr=0.1),
    )
    batch = (torch.randn(8, 4), torch.arange(8) % 2)
    profiler.fit_start(ctx)
    for _ in range(batches):
        ctx.state, ctx.metrics = step(ctx.state, batch)
        profiler.batch_end(ctx)
    profiler.fit_end(ctx)


def test_writes_a_chrome_trace_of_the_window(make_ctx, tmp_path):
    ctx = make_ctx(run_dir=str(tmp_path))
    profiler = TorchProfiler(skip_first=1, wait=1, warmup=1, active=2)
    _train(profiler, ctx, batches=7)
    # skip 1, wait 1, warm up 1, record steps 4 and 5: written when step 5 ends.
    assert profiler.traces == [tmp_path / "traces" / "rank0_step5.json"]
    trace = json.loads(profiler.traces[0].read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "aten::addmm" in names or "aten::linear" in names  # the model's matmuls are in it
    steps = {n for n in names if isinstance(n, str) and n.startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#3", "ProfilerStep#4"}  # exactly the two active steps


def test_unfinished_window_is_written_at_fit_end_compressed(make_ctx, tmp_path):
    ctx = make_ctx()
    profiler = TorchProfiler(skip_first=0, warmup=1, active=10, trace_dir=tmp_path, compress=True)
    _train(profiler, ctx, batches=3)
    (path,) = profiler.traces
    assert path.name.endswith(".json.gz")
    assert "traceEvents" in json.loads(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize("kwargs", [{"active": 0}, {"wait": -1}, {"skip_first": -2}])
def test_bad_schedule(kwargs):
    with pytest.raises(ValueError, match="TorchProfiler"):
        TorchProfiler(**kwargs)
