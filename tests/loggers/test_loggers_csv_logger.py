"""CSVLogger: one row per step, the union of metric names as columns, resume-safe, rank 0 only."""

from __future__ import annotations

import csv
import doctest
import importlib
import json
import math
import pathlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain.loggers import CSVLogger


def read(path):
    with open(path, newline="") as file:
        rows = list(csv.reader(file))
    return rows[0], rows[1:]


def test_rows_and_columns(tmp_path):
    path = tmp_path / "m.csv"
    logger = CSVLogger(path)
    logger.log_metrics({"train/loss": torch.tensor(0.5), "lr": 0.1}, step=1)
    logger.log_metrics({"train/loss": 0.25, "lr": 0.1}, step=2)
    logger.log_metrics({"eval/accuracy": 0.75}, step=2)  # same step: fills row 2
    logger.log_metrics({"train/loss": math.nan, "grad": {"norm": math.inf}}, step=3)
    header, rows = read(path)  # flushed: readable before close
    assert header == ["step", "train/loss", "lr", "eval/accuracy", "grad/norm"]
    assert rows == [
        ["1", "0.5", "0.1", "", ""],
        ["2", "0.25", "0.1", "0.75", ""],
        ["3", "nan", "", "", "inf"],
    ]
    assert math.isnan(float(rows[2][1])) and float(rows[2][4]) == math.inf
    logger.close()
    logger.close()  # twice is fine


def test_a_new_metric_on_a_new_step_rewrites_the_header_keeping_old_rows(tmp_path):
    path = tmp_path / "m.csv"
    logger = CSVLogger(path)
    for step in range(1, 4):
        logger.log_metrics({"loss": float(step)}, step=step)
    logger.log_metrics({"loss": 4.0, "eval/acc": 0.5}, step=4)
    logger.log_metrics({"loss": 5.0}, step=5)
    logger.close()
    header, rows = read(path)
    assert header == ["step", "loss", "eval/acc"]
    assert rows == [
        ["1", "1.0", ""],
        ["2", "2.0", ""],
        ["3", "3.0", ""],
        ["4", "4.0", "0.5"],
        ["5", "5.0", ""],
    ]
    assert not (tmp_path / "m.csv.tmp").exists()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # how far the step moves (0: the same step again)
            st.dictionaries(st.sampled_from("abcde"), st.floats(-10, 10), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_one_row_per_step_holding_every_value_logged_for_it(tmp_path_factory, calls):
    """The law: rows are the logged steps in order, and each cell is the last value logged for
    that (step, metric), blank where none was."""
    path = tmp_path_factory.mktemp("csv") / "m.csv"
    logger = CSVLogger(path)
    expected: dict[int, dict[str, float]] = {}
    step = 0
    for delta, metrics in calls:
        step += delta
        logger.log_metrics(metrics, step=step)
        expected.setdefault(step, {}).update(metrics)
    logger.close()
    header, rows = read(path)
    names = [n for n in dict.fromkeys(k for _, m in calls for k in m)]
    assert header == ["step", *names]
    assert [int(r[0]) for r in rows] == list(expected)
    for row in rows:
        want = expected[int(row[0])]
        assert row[1:] == [repr(float(want[n])) if n in want else "" for n in names]


def test_a_resumed_run_appends_under_the_same_header(tmp_path):
    path = tmp_path / "m.csv"
    first = CSVLogger(path)
    first.log_metrics({"loss": 1.0, "acc": 0.1}, step=1)
    first.log_metrics({"loss": 2.0}, step=2)
    first.close()
    resumed = CSVLogger(path)
    resumed.log_metrics({"acc": 0.3}, step=2)  # re-logged after the checkpoint: a new row
    resumed.log_metrics({"loss": 3.0, "new": 7.0}, step=3)
    resumed.close()
    header, rows = read(path)
    assert header == ["step", "loss", "acc", "new"]
    assert rows == [
        ["1", "1.0", "0.1", ""],
        ["2", "2.0", "", ""],
        ["2", "", "0.3", ""],
        ["3", "3.0", "", "7.0"],
    ]


def test_default_file_in_run_dir_rank_suffix_and_hparams(make_ctx, tmp_path):
    logger = CSVLogger()
    logger.fit_start(make_ctx(run_dir=str(tmp_path)))
    logger.log_metrics({"loss": 1.0}, step=1)
    logger.log_hparams({"lr": 0.1, "model": "cnn"})
    logger.close()
    assert read(tmp_path / "metrics.csv") == (["step", "loss"], [["1", "1.0"]])
    assert json.loads((tmp_path / "hparams.json").read_text()) == {"lr": 0.1, "model": "cnn"}

    other = CSVLogger(all_ranks=True)
    other.fit_start(make_ctx(run_dir=str(tmp_path), rank=2))
    other.log_metrics({"loss": 2.0}, step=1)
    other.close()
    assert read(tmp_path / "metrics.rank2.csv") == (["step", "loss"], [["1", "2.0"]])


def test_rank_zero_only_by_default(make_ctx, tmp_path):
    logger = CSVLogger()
    logger.fit_start(make_ctx(run_dir=str(tmp_path), rank=1))
    logger.log_metrics({"loss": 1.0}, step=1)
    logger.log_hparams({"lr": 0.1})
    assert list(tmp_path.iterdir()) == []


def test_no_path_and_no_run_dir_fails_at_the_start(make_ctx):
    with pytest.raises(ValueError, match=r"CSVLogger\(path=...\)"):
        CSVLogger().fit_start(make_ctx())


def test_through_fit(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]

    def loss_fn(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]), batch[1])

    opt = functrain.optim.sgd(lr=0.1)
    state = functrain.init(model, opt)
    step = functrain.make_step(model, loss_fn, opt)
    logger = CSVLogger()
    functrain.fit(
        step, state, data, duration="4ba", loggers=[logger], log_interval="1ba", run_dir=tmp_path
    )
    header, rows = read(tmp_path / "metrics.csv")
    assert header[0] == "step" and any(h.endswith("loss") for h in header)
    assert [int(r[0]) for r in rows] == sorted({int(r[0]) for r in rows})  # one row per step
    assert {1, 2, 3, 4} <= {int(r[0]) for r in rows}
    assert logger._file is None  # closed at FIT_END


def test_docstring_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module("functrain.loggers.csv_logger")
    globs = {"CSVLogger": CSVLogger, "torch": torch, "Path": pathlib.Path}
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(module, globs=globs):
        if test.name.endswith("csv_logger"):
            runner.run(test)
    assert runner.failures == 0 and runner.tries > 0
