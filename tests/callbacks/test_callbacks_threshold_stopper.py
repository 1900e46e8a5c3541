"""ThresholdStopper: stop once an evaluation metric reaches its target."""

from __future__ import annotations

import pytest

from functrain.callbacks import ThresholdStopper


@pytest.mark.parametrize(
    "mode, values, stop_index",
    [("max", [0.90, 0.95, 0.97, 0.99], 2), ("min", [0.5, 0.3, 0.2], 2), ("max", [0.1, 0.2], None)],
)
def test_stops_when_the_target_is_reached(make_ctx, advance, mode, values, stop_index):
    threshold = 0.97 if mode == "max" else 0.2
    ctx = make_ctx()
    stopper = ThresholdStopper("metric", threshold, mode=mode)
    stopped = None
    for index, value in enumerate(values):
        advance(ctx)
        ctx.eval_metrics = {"metric": value}
        stopper.eval_end(ctx)
        if ctx.stop_requested:
            stopped = index
            break
    assert stopped == stop_index
    if stop_index is not None:
        assert stopper.reached_at == stop_index + 1
        assert f"at batch {stop_index + 1}" in ctx.stop_reason


def test_errors(make_ctx):
    with pytest.raises(ValueError, match="mode"):
        ThresholdStopper("accuracy", 0.9, mode="above")
    ctx = make_ctx()
    ctx.eval_metrics = {"loss": 1.0}
    with pytest.raises(KeyError, match="accuracy"):
        ThresholdStopper("accuracy", 0.9).eval_end(ctx)
