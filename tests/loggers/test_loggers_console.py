"""ConsoleLogger: readable lines, an interval for training, evaluation always shown."""

from __future__ import annotations

import io

from functrain.loggers import ConsoleLogger


def test_prints_one_line_per_call():
    out = io.StringIO()
    logger = ConsoleLogger(stream=out)
    logger.log_metrics({"train/loss": 0.251234, "train/lr": 0.001, "train/samples": 32}, step=10)
    assert out.getvalue() == "[step 10] train/loss 0.2512  train/lr 0.001  train/samples 32\n"


def test_interval_filters_training_but_not_evaluation(make_ctx, advance):
    out = io.StringIO()
    logger = ConsoleLogger(interval="4ba", stream=out)
    ctx = make_ctx()
    logger.fit_start(ctx)
    for _ in range(6):
        logger.batch_start(ctx)
        advance(ctx)
        logger.log_metrics({"train/loss": 1.0}, step=ctx.timestamp.batch)
        logger.batch_end(ctx)
    logger.eval_start(ctx)
    logger.log_metrics({"eval/accuracy": 0.9}, step=ctx.timestamp.batch)  # step 6: off-interval
    lines = out.getvalue().splitlines()
    assert lines == ["[step 4] train/loss 1", "[step 6] eval/accuracy 0.9"]


def test_all_ranks_prefixes_the_rank(make_ctx):
    out = io.StringIO()
    logger = ConsoleLogger(stream=out, all_ranks=True)
    logger.fit_start(make_ctx(rank=2))
    logger.log_metrics({"loss": 1.5}, step=1)
    assert out.getvalue().startswith("[rank 2] [step 1] loss 1.5")


def test_other_ranks_are_silent(make_ctx):
    out = io.StringIO()
    logger = ConsoleLogger(stream=out)
    logger.fit_start(make_ctx(rank=1))
    logger.log_metrics({"loss": 1.5}, step=1)
    assert out.getvalue() == ""


def test_says_why_a_run_stopped(make_ctx):
    out = io.StringIO()
    logger = ConsoleLogger(stream=out)
    ctx = make_ctx()
    ctx.request_stop("EarlyStopper: 'accuracy' has not improved")
    logger.fit_end(ctx)
    assert out.getvalue() == "[stopped] EarlyStopper: 'accuracy' has not improved\n"
