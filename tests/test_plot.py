"""`python -m functrain.plot RUN_DIR`: curves from the JSONL log to a PNG."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from functrain.loggers import JSONLLogger
from functrain.plot import main, make_figure, panels, plot_run


def _write_run(run_dir, steps=60):
    logger = JSONLLogger(run_dir / "metrics.jsonl")
    for step in range(1, steps + 1):
        logger.log_metrics(
            {
                "train/loss": 2.3 * math.exp(-step / 20) + 0.1,
                "train/lr": 1e-3 * min(1.0, step / 10),
                "throughput/samples_per_sec": 900.0 + 10 * math.sin(step),
                "train/grad_norm": 1.0,
            },
            step=step,
        )
        if step % 20 == 0:
            logger.log_metrics({"eval/loss": 0.5 + 1 / step, "eval/accuracy": 1 - 1 / step}, step)
    logger.close()


def test_command_writes_a_png(tmp_path):
    _write_run(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "functrain.plot", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],  # the repository root: functrain importable
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "curves.png"
    assert f"wrote {out}" in result.stdout
    image = imread(out)
    assert image.shape[0] >= 600 and image.shape[1] >= 1000  # four panels, 2 x 2
    assert image[..., :3].std() > 0.05  # something was drawn


def test_panels_group_the_keys():
    series = {k: [(1, 1.0)] for k in [
        "train/loss", "eval/loss", "eval/cross_entropy", "train/lr", "lr/body.lr",
        "throughput/samples_per_sec", "throughput/device/samples_per_sec", "eval/accuracy",
        "train/grad_norm",
    ]}  # fmt: skip
    assert panels(series) == [
        ("loss", ["eval/cross_entropy", "eval/loss", "train/loss"]),
        ("learning rate", ["lr/body.lr", "train/lr"]),
        ("throughput", ["throughput/samples_per_sec"]),
        ("eval metrics", ["eval/accuracy"]),
    ]


def test_out_option_and_partial_logs(tmp_path):
    logger = JSONLLogger(tmp_path / "metrics.jsonl")
    logger.log_metrics({"train/loss": 1.0}, step=1)
    logger.log_metrics({"train/loss": 0.5}, step=2)
    logger.close()
    out = plot_run(tmp_path, tmp_path / "sub" / "loss.png")
    assert out.exists() and imread(out).shape[1] >= 500


def test_clear_errors(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert "JSONLLogger" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/samples": 32}\n')
    with pytest.raises(ValueError, match="nothing to plot|no loss"):
        plot_run(tmp_path)


def test_axes_are_labelled_and_one_learning_rate_is_drawn_once():
    ramp = [(step, 1e-3 * min(1.0, step / 10)) for step in range(1, 41)]
    series = {
        "loss": [(step, 2.0 / step) for step in range(1, 41)],
        "lr": ramp,  # the step's lr ...
        "lr/group0": list(ramp),  # ... and an LR monitor's: one schedule
        "lr/head": [(step, 2e-3) for step in range(1, 41)],  # another one
        "throughput/samples_per_sec": [(step, 100.0) for step in range(1, 41)],
        "eval/accuracy": [(20, 0.5), (40, 0.9)],
    }
    figure = make_figure(series, "run")
    by_title = {axes.get_title(): axes for axes in figure.axes if axes.get_title()}
    assert {t: a.get_ylabel() for t, a in by_title.items()} == {
        "loss": "loss",
        "learning rate": "learning rate",
        "throughput": "samples / s",
        "eval metrics": "metric value",
    }
    labels = [line.get_label() for line in by_title["learning rate"].get_lines()]
    assert labels == ["lr = lr/group0", "lr/head"]
    assert all(axes.get_xlabel() == "step" for axes in by_title.values())
    assert figure._suptitle.get_text() == "run"


def _lr_find_result():
    from functrain.loop.lr_find import LRFindResult, steepest_descent

    lrs = [1e-5 * 10 ** (i / 20) for i in range(80)]
    losses = [2.3 - 2.0 / (1 + math.exp(-(math.log10(lr) + 2.5) * 3)) for lr in lrs]
    losses[-10:] = [loss * 1.5**k for k, loss in enumerate(losses[-10:])]  # diverges
    index = steepest_descent(losses)
    return LRFindResult(lrs, losses, losses, lrs[index], index, "the loss diverged", 1e-5, 1e-1, 80)


def test_an_lr_find_result_is_drawn_from_its_file_or_its_directory(tmp_path, capsys):
    from functrain.plot import plot_lr_find

    result = _lr_find_result()
    path = result.save(tmp_path / "lr_find.json")
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'lr_find.png'}"
    image = imread(tmp_path / "lr_find.png")
    assert image[..., :3].std() > 0.05
    # A directory with lr_find.json and no metrics log: the range test is what it holds.
    assert main([str(tmp_path), "--out", str(tmp_path / "dir.png")]) == 0
    assert (tmp_path / "dir.png").exists()
    # A run directory keeps drawing its metrics even when it also holds an lr_find.json.
    _write_run(tmp_path)
    assert main([str(tmp_path)]) == 0 and (tmp_path / "curves.png").exists()
    (tmp_path / "other.json").write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match="not an lr_find result"):
        plot_lr_find(tmp_path / "other.json")
    assert main([str(tmp_path / "other.json")]) == 1
