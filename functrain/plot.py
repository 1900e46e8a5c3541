"""`python -m functrain.plot RUN_DIR`: draw a run's curves from its JSONL log to a PNG.

Given an LR range test's result (`lr_find(...).save("lr_find.json")`, or a directory holding
`lr_find.json` and no metrics log) it draws that instead: the loss against the learning rate on a
log axis, raw and smoothed, with the suggested learning rate marked (`plot_lr_find`).

Reads `RUN_DIR/metrics.jsonl` (written by `functrain.loggers.JSONLLogger`) and draws up to four
panels against the training step, each with a labelled y axis: losses (training and evaluation),
learning rate (one curve per distinct schedule: identical series under two names are drawn once),
throughput, and the other evaluation metrics. The figure goes to `RUN_DIR/curves.png` unless `--out` says
otherwise.

Example:
    $ python -m functrain.plot runs/digits
    wrote runs/digits/curves.png
    $ python -m functrain.plot runs/lr_find.json
    wrote runs/lr_find.png
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from .loggers.jsonl import DEFAULT_FILE_NAME, read_metrics

OUT_FILE_NAME = "curves.png"

Series = dict[str, list[tuple[int, float]]]


def _last(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _is_loss(key: str) -> bool:
    return _last(key) in ("loss", "cross_entropy") or key.endswith("_loss")


def _is_lr(key: str) -> bool:
    return bool(re.fullmatch(r"(train/)?(lr|learning_rate)(/.*)?", key))


def _is_throughput(key: str) -> bool:
    return key in ("throughput/samples_per_sec", "throughput/tokens_per_sec")


def _is_eval(key: str) -> bool:
    return key.startswith(("eval/", "val/", "eval_", "val_"))


YLABELS = {
    "loss": "loss",
    "learning rate": "learning rate",
    "throughput": "samples / s",
    "eval metrics": "metric value",
}


def distinct(series: Series, keys: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """`keys` without those whose curve repeats an earlier key's (the step's `lr` and an LR
    monitor's `lr/...` of a single group are one curve), and `{kept: [dropped aliases]}`."""
    kept: list[str] = []
    aliases: dict[str, list[str]] = {}
    for key in keys:
        same = next((k for k in kept if series[k] == series[key]), None)
        if same is None:
            kept.append(key)
        else:
            aliases.setdefault(same, []).append(key)
    return kept, aliases


def panels(series: Series) -> list[tuple[str, list[str]]]:
    """Group metric keys into panels: `[(title, keys), ...]`, empty panels left out.

    Args:
        series: `{key: [(step, value), ...]}` as from `read_metrics`.
    Returns:
        the panels in display order.
    """
    keys = sorted(series)
    groups = [
        ("loss", [k for k in keys if _is_loss(k)]),
        ("learning rate", [k for k in keys if _is_lr(k)]),
        ("throughput", [k for k in keys if _is_throughput(k)]),
        ("eval metrics", [k for k in keys if _is_eval(k) and not _is_loss(k)]),
    ]
    return [(title, members) for title, members in groups if members]


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Draw the curves of the run in `run_dir` and write them as a PNG.

    Args:
        run_dir: a run directory holding `metrics.jsonl` (or the JSONL file itself).
        out: the PNG to write (default: `<run_dir>/curves.png`).
    Returns:
        the path written.
    Raises:
        FileNotFoundError: no metrics file; ValueError: nothing plottable in it.
    """
    run_dir = Path(run_dir)
    log = run_dir if run_dir.is_file() else run_dir / DEFAULT_FILE_NAME
    if not log.exists():
        raise FileNotFoundError(
            f"no metrics log at {log}: train with loggers=[functrain.loggers.JSONLLogger()] and "
            "fit(..., run_dir=RUN_DIR), or point to the .jsonl file itself"
        )
    series = read_metrics(log)
    groups = panels(series)
    if not groups:
        raise ValueError(
            f"{log} has no loss, learning-rate, throughput or eval metric to plot (found: "
            f"{sorted(series) or 'nothing'})"
        )
    out = Path(out) if out is not None else log.parent / OUT_FILE_NAME
    figure = make_figure(series, str(run_dir.name if run_dir.is_dir() else log.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


def make_figure(series: Series, name: str) -> Any:
    """The matplotlib `Figure` of `series` (panels as `panels` groups them).

    Args:
        series: `{key: [(step, value), ...]}` as from `read_metrics`.
        name: the figure's title (the run's name).
    Returns:
        the figure (on an Agg canvas: `figure.savefig(path)` writes it).
    """
    # The Agg canvas directly, not pyplot: no display, and the caller's backend is untouched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = panels(series)
    columns = 1 if len(groups) == 1 else 2
    rows = math.ceil(len(groups) / columns)
    figure = Figure(figsize=(6.0 * columns, 3.6 * rows), dpi=110)
    FigureCanvasAgg(figure)
    for index, (title, keys) in enumerate(groups):
        axes = figure.add_subplot(rows, columns, index + 1)
        keys, aliases = distinct(series, keys)
        lines = []
        for number, key in enumerate(keys):
            target = axes
            if key == "throughput/tokens_per_sec" and len(keys) > 1:
                target = axes.twinx()  # tokens/s is ~context-length times samples/s
                target.set_ylabel("tokens / s")
            elif key == "throughput/tokens_per_sec":
                axes.set_ylabel("tokens / s")
            label = " = ".join([key, *aliases.get(key, [])])
            steps = [s for s, _ in series[key]]
            values = [v for _, v in series[key]]
            style = "o-" if len(steps) <= 30 else "-"  # sparse series (evals) get markers
            lines += target.plot(
                steps, values, style, markersize=3, linewidth=1.2, label=label, color=f"C{number}"
            )
            top = max((v for v in values if math.isfinite(v)), default=0.0)
            if title == "throughput" and top > 0:
                target.set_ylim(0, 1.15 * top)  # from zero: noise should look like noise
        finite = [v for k in keys for _, v in series[k] if math.isfinite(v)]
        if title == "loss" and finite and min(finite) > 0:
            if max(finite) / min(finite) > 50:  # spans decades: a log axis shows the shape
                axes.set_yscale("log")
        axes.set_title(title)
        axes.set_xlabel("step")
        if not axes.get_ylabel():
            axes.set_ylabel(YLABELS[title])
        axes.grid(True, alpha=0.3)
        axes.legend(lines, [str(line.get_label()) for line in lines], fontsize=7)
    figure.suptitle(name)
    figure.tight_layout()
    return figure


def _lr_find_file(path: Path) -> Path | None:
    """The LR range test result `path` names (the file, or `lr_find.json` in a directory that
    has no metrics log), else None."""
    from .loop.lr_find import DEFAULT_FILE_NAME as LR_FIND_FILE

    if path.is_file() and path.suffix == ".json":
        return path
    if path.is_dir() and not (path / DEFAULT_FILE_NAME).exists():
        return path / LR_FIND_FILE if (path / LR_FIND_FILE).exists() else None
    return None


def plot_lr_find(result_file: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Draw an LR range test (`functrain.loop.lr_find.LRFindResult.save`) and write a PNG.

    Args:
        result_file: the JSON file the result was saved to.
        out: the PNG to write (default: the result's file with the suffix ".png").
    Returns:
        the path written.
    Raises:
        ValueError: the file is not an lr_find result, or its curve is empty.
    Example:
        >>> plot_lr_find("runs/lr_find.json")
        PosixPath('runs/lr_find.png')
    """
    from .loop.lr_find import LRFindResult

    path = Path(result_file)
    try:
        result = LRFindResult.load(path)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{path} is not an lr_find result: {error}") from error
    if not result.lrs:
        raise ValueError(f"{path} holds no points: the range test took no step")
    out = Path(out) if out is not None else path.with_suffix(".png")
    figure = lr_find_figure(result, path.stem)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


def lr_find_figure(result: Any, name: str) -> Any:
    """The matplotlib `Figure` of an `LRFindResult`: loss against lr (log), the suggestion marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 3.8), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    axes.plot(result.lrs, result.losses, "-", color="C0", alpha=0.35, linewidth=1, label="loss")
    axes.plot(result.lrs, result.smoothed, "-", color="C0", linewidth=1.6, label="smoothed")
    title = f"{name}: no suggestion (too few points)"
    if result.suggestion is not None:
        i = result.suggestion_index
        axes.axvline(result.suggestion, color="C3", linestyle="--", linewidth=1)
        axes.plot([result.suggestion], [result.smoothed[i]], "o", color="C3",
                  label=f"suggested lr {result.suggestion:.2e}")  # fmt: skip
        title = f"{name}: suggested lr {result.suggestion:.2e}"
    finite = [v for v in result.smoothed if math.isfinite(v)]
    if finite:  # the divergence would squash the curve: show up to a little above the start
        raw = [v for v in result.losses if math.isfinite(v)]
        low = min(finite + raw)
        high = max(finite[: max(1, len(finite) // 4)] + [min(finite)])
        axes.set_ylim(low - 0.05 * (high - low + 1e-12), high + 0.25 * (high - low + 1e-12))
    axes.set_xscale("log")
    axes.set_xlabel("learning rate")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(True, alpha=0.3, which="both")
    axes.legend(fontsize=7)
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    """The command line: `python -m functrain.plot RUN_DIR [--out FILE.png]`."""
    parser = argparse.ArgumentParser(
        prog="python -m functrain.plot",
        description="Draw a run's loss, learning rate, throughput and eval curves (or an LR "
        "range test) to a PNG.",
    )
    parser.add_argument(
        "run_dir", help="the run directory (holding metrics.jsonl), or an lr_find result (.json)"
    )
    parser.add_argument("--out", default=None, help="the PNG to write (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        lr_find_file = _lr_find_file(Path(args.run_dir))
        if lr_find_file is not None:
            out = plot_lr_find(lr_find_file, args.out)
        else:
            out = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as error:
        print(f"functrain.plot: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
