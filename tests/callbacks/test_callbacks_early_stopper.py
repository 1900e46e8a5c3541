"""EarlyStopper: patience in evaluations or in time, min_delta, modes, exact resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.callbacks import EarlyStopper


def _evaluate(stopper, ctx, advance, values, batches_between=1, key="accuracy"):
    """Feed evaluation results; return the index of the evaluation that stopped (or None)."""
    for index, value in enumerate(values):
        for _ in range(batches_between):
            advance(ctx)
        ctx.eval_metrics = {key: value}
        stopper.eval_end(ctx)
        if ctx.stop_requested:
            return index
    return None


def test_stops_after_patience_evaluations(make_ctx, advance):
    ctx = make_ctx()
    stopper = EarlyStopper("accuracy", patience=3)
    assert _evaluate(stopper, ctx, advance, [0.5, 0.6, 0.6, 0.59, 0.58, 0.9]) == 4
    assert stopper.best == 0.6 and stopper.wait == 3
    assert "'accuracy' has not improved on its best 0.6" in ctx.stop_reason


def test_min_delta_and_min_mode(make_ctx, advance):
    ctx = make_ctx()
    stopper = EarlyStopper("loss", patience=2, min_delta=0.05, mode="min")
    # 0.97 and 0.96 improve on 1.0 by less than min_delta: they do not count.
    assert _evaluate(stopper, ctx, advance, [1.0, 0.97, 0.96, 0.5], key="loss") == 2


def test_patience_in_training_time(make_ctx, advance):
    ctx = make_ctx()
    ctx.state = ctx.state.replace(timestamp=ctx.state.timestamp.replace(batches_per_epoch=10))
    stopper = EarlyStopper("accuracy", patience="2ep")
    # An evaluation every 5 batches: the best at batch 5; 20 batches later is batch 25.
    values = [0.9, 0.8, 0.8, 0.8, 0.8, 0.8]
    assert _evaluate(stopper, ctx, advance, values, batches_between=5) == 4


def test_missing_metric_names_the_ones_there_are(make_ctx):
    ctx = make_ctx()
    ctx.eval_metrics = {"loss": 0.3, "cross_entropy": 0.3}
    with pytest.raises(KeyError, match=r"produced \['cross_entropy', 'loss'\]"):
        EarlyStopper("accuracy").eval_end(ctx)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"mode": "up"}, "mode"), ({"patience": 0}, "patience"), ({"min_delta": -1}, "min_delta")],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EarlyStopper(**kwargs)


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12),
    cut=st.integers(0, 12),
    patience=st.integers(1, 4),
    mode=st.sampled_from(["min", "max"]),
)
def test_resume_from_state_dict_matches_an_uninterrupted_run(
    make_ctx, advance, values, cut, patience, mode
):
    whole = EarlyStopper("m", patience=patience, mode=mode, min_delta=0.01)
    stopped_at = _evaluate(whole, make_ctx(), advance, values, key="m")

    cut = min(cut, len(values))
    first = EarlyStopper("m", patience=patience, mode=mode, min_delta=0.01)
    ctx = make_ctx()
    early = _evaluate(first, ctx, advance, values[:cut], key="m")
    if early is not None:
        assert early == stopped_at
        return
    second = EarlyStopper("m", patience=patience, mode=mode, min_delta=0.01)
    second.load_state_dict(first.state_dict())
    later = _evaluate(second, ctx, advance, values[cut:], key="m")
    assert (None if later is None else cut + later) == stopped_at
    assert second.state_dict() == pytest.approx(whole.state_dict(), nan_ok=True)
