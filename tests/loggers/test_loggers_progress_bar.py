"""ProgressBar: a train bar and an eval bar in a terminal, lines elsewhere; no device reads
between logging steps."""

from __future__ import annotations

import io

from functrain.loggers import ProgressBar


def _horizon(ctx, max_batches):
    ctx.state = ctx.state.replace(timestamp=ctx.state.timestamp.replace(max_batches=max_batches))
    return ctx


def test_bars_show_progress_loss_and_eval(make_ctx, advance, counting):
    out = io.StringIO()
    bar = ProgressBar(enabled=True, stream=out)
    ctx = _horizon(make_ctx(), 10)
    bar.fit_start(ctx)
    for _ in range(10):
        bar.batch_end(advance(ctx, loss=counting(0.5)))  # the metrics are never read here
    assert counting.reads == []
    bar.log_metrics({"train/loss": 0.4321, "throughput/samples_per_sec": 1234.0}, step=10)
    bar.eval_start(ctx)
    for _ in range(3):
        bar.eval_batch_end(ctx)
    assert bar.eval_bar.n == 3
    ctx.eval_metrics = {"accuracy": 0.97}
    bar.eval_end(ctx)
    assert bar.eval_bar is None
    assert bar.train_bar.n == 10 and bar.train_bar.total == 10
    postfix = bar.train_bar.postfix
    bar.fit_end(ctx)
    assert "loss=0.4321" in postfix and "sp/s=1234" in postfix and "eval_accuracy=0.97" in postfix
    text = out.getvalue()
    assert "10/10" in text and "train ep 0" in text and "loss=0.4321" in text


def test_resumed_run_starts_where_it_left_off(make_ctx, advance):
    bar = ProgressBar(enabled=True, stream=io.StringIO())
    ctx = make_ctx()
    for _ in range(7):
        advance(ctx)
    bar.fit_start(_horizon(ctx, 20))
    assert bar.train_bar.n == 7
    bar.batch_end(advance(ctx))
    assert bar.train_bar.n == 8
    bar.close()


def test_lines_when_not_a_terminal(make_ctx, advance, monkeypatch):
    # Without a terminal (a log file, the launcher's pipes) a bar's carriage returns would never
    # show: whole lines instead, timed, at epoch ends, and at the end.
    import functrain.loggers.progress_bar as module

    clock = iter(float(t) for t in range(0, 1000, 10))  # 10 s between calls
    monkeypatch.setattr(module.wallclock, "monotonic", lambda: next(clock))
    out = io.StringIO()  # isatty() is False
    bar = ProgressBar(stream=out, line_every_sec=25)
    ctx = _horizon(make_ctx(), 5)
    bar.fit_start(ctx)
    for _ in range(4):
        bar.batch_end(advance(ctx))
    bar.log_metrics({"train/loss": 0.25}, step=4)
    bar.batch_end(advance(ctx))
    bar.fit_end(ctx)
    lines = out.getvalue().splitlines()
    assert bar.train_bar is None and "\r" not in out.getvalue()
    assert lines[0].startswith("train: epoch 0  batch 3/5 (60%)")  # 30 s after the start
    assert lines[-1].startswith("train (end): epoch 0  batch 5/5 (100%)  loss 0.25")
    assert len(lines) == 2


def test_off_when_disabled_and_status_lines(make_ctx, advance):
    out = io.StringIO()
    bar = ProgressBar(stream=out, enabled=False)
    ctx = _horizon(make_ctx(), 5)
    bar.fit_start(ctx)
    bar.batch_end(advance(ctx))
    bar.say("resumed from x")
    bar.fit_end(ctx)
    assert out.getvalue() == ""
    shown = ProgressBar(stream=out)
    shown.init(make_ctx())
    shown.say("resumed from x at step 3")
    assert out.getvalue() == "functrain: resumed from x at step 3\n"


def test_off_on_other_ranks(make_ctx):
    out = io.StringIO()
    bar = ProgressBar(enabled=True, stream=out)
    bar.fit_start(make_ctx(rank=1))
    bar.say("resumed")
    lines = ProgressBar(stream=out)
    lines.fit_start(make_ctx(rank=1))
    lines.fit_end(make_ctx(rank=1))
    assert bar.train_bar is None and out.getvalue() == ""
