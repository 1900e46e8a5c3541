"""JSONLLogger and read_metrics: strict JSON lines, resume-safe reading."""

from __future__ import annotations

import json
import math

import pytest
import torch

from functrain.loggers import JSONLLogger, read_metrics


def test_one_object_per_call(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = JSONLLogger(path)
    logger.log_metrics({"train/loss": torch.tensor(0.25), "train/lr": 0.1}, step=10)
    logger.log_metrics({"eval/accuracy": 0.5, "bad": math.nan, "big": math.inf}, step=20)
    logger.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [set(r) for r in rows] == [
        {"step", "time", "train/loss", "train/lr"},
        {"step", "time", "eval/accuracy", "bad", "big"},
    ]
    assert rows[0]["step"] == 10 and rows[0]["train/loss"] == 0.25
    assert rows[1]["bad"] == "nan" and rows[1]["big"] == "inf"  # strict JSON
    assert rows[0]["time"] <= rows[1]["time"]


def test_read_metrics_last_write_wins_and_skips_torn_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    first = JSONLLogger(path)
    for step in (1, 2, 3):
        first.log_metrics({"loss": float(step)}, step=step)
    first.close()
    with open(path, "a") as file:
        file.write('{"step": 4, "loss": 0.')  # the run was killed mid-line
        file.write("\n")
    resumed = JSONLLogger(path)  # resumed from step 2: step 3 is logged again
    resumed.log_metrics({"loss": 30.0, "eval/acc": math.nan}, step=3)
    resumed.close()
    series = read_metrics(path)
    assert series["loss"] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert math.isnan(series["eval/acc"][0][1])


def test_default_file_in_run_dir_and_rank_suffix(make_ctx, tmp_path):
    logger = JSONLLogger()
    logger.fit_start(make_ctx(run_dir=str(tmp_path)))
    logger.log_metrics({"loss": 1.0}, step=1)
    logger.write_hparams({"lr": 0.1, "model": "mlp"})
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == {"loss": [(1, 1.0)]}
    assert json.loads((tmp_path / "hparams.json").read_text()) == {"lr": 0.1, "model": "mlp"}

    other = JSONLLogger(all_ranks=True)
    other.fit_start(make_ctx(run_dir=str(tmp_path), rank=3))
    other.log_metrics({"loss": 2.0}, step=1)
    other.close()
    assert read_metrics(tmp_path / "metrics.rank3.jsonl") == {"loss": [(1, 2.0)]}


def test_no_path_and_no_run_dir_fails_at_the_start(make_ctx):
    with pytest.raises(ValueError, match="run_dir"):
        JSONLLogger().fit_start(make_ctx())


def test_no_file_on_other_ranks(make_ctx, tmp_path):
    logger = JSONLLogger()
    logger.fit_start(make_ctx(run_dir=str(tmp_path), rank=1))
    logger.log_metrics({"loss": 1.0}, step=1)
    assert list(tmp_path.iterdir()) == []


def test_fit_end_closes_and_a_second_fit_appends(make_ctx, tmp_path):
    logger = JSONLLogger()
    ctx = make_ctx(run_dir=str(tmp_path))
    logger.fit_start(ctx)
    logger.log_metrics({"loss": 1.0}, step=1)
    logger.fit_end(ctx)
    assert logger._file is None
    logger.fit_start(ctx)  # fit called again to continue the run
    logger.log_metrics({"loss": 0.5}, step=2)
    logger.fit_end(ctx)
    assert read_metrics(tmp_path / "metrics.jsonl") == {"loss": [(1, 1.0), (2, 0.5)]}
