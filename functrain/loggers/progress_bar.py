"""`ProgressBar`: a tqdm bar for training and one for evaluation.

The training bar counts batches towards the run's horizon and shows tqdm's own rate and ETA, plus
the loss, throughput and latest evaluation results from the loop's logging steps. It moves on every
batch without reading any device value: numbers change only when the loop logs. The evaluation bar
appears under it while an evaluation runs. Both are off when the stream is not a terminal (logs of
batch jobs stay clean) unless `enabled=True`.

Example:
    >>> functrain.fit(step, state, loader, duration="3ep", loggers=[ProgressBar()])  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from tqdm import tqdm

from .base import Logger
from .console import format_value

# Metric key -> the short label shown in the bar.
DEFAULT_SHOWN = {
    "train/loss": "loss",  # as fit logs the step's metrics
    "loss": "loss",
    "throughput/samples_per_sec": "sp/s",
    "throughput/tokens_per_sec": "tok/s",
}


class ProgressBar(Logger):
    """Progress bars for training and evaluation.

    Args:
        show: metric keys to show next to the bar (a sequence, or a `{key: label}` dict);
            evaluation metrics of `ctx.eval_metrics` are shown too.
        enabled: True forces the bars on, False off; None (default) shows them only when
            `stream` is a terminal.
        stream: where to draw (default: `sys.stderr`, as tqdm does).
        digits: significant digits of the numbers shown.
    """

    def __init__(
        self,
        show: Sequence[str] | dict[str, str] | None = None,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        digits: int = 4,
    ):
        super().__init__(all_ranks=False)
        if show is None:
            show = DEFAULT_SHOWN
        self.show = dict(show) if isinstance(show, dict) else {k: k for k in show}
        self.enabled = enabled
        self.stream = stream
        self.digits = digits
        self.train_bar: tqdm | None = None
        self.eval_bar: tqdm | None = None
        self._postfix: dict[str, str] = {}

    def _on(self, ctx: Any) -> bool:
        if not self.observe(ctx):
            return False
        if self.enabled is not None:
            return self.enabled
        stream = self.stream or sys.stderr
        return bool(getattr(stream, "isatty", lambda: False)())

    def fit_start(self, ctx: Any) -> None:
        if not self._on(ctx) or self.train_bar is not None:
            return
        ts = ctx.timestamp
        self.train_bar = tqdm(
            total=ts.max_batches or None,
            initial=ts.batch,
            desc=f"train ep {ts.epoch}",
            unit="ba",
            file=self.stream,
            dynamic_ncols=True,
            leave=True,
            position=0,
        )

    def epoch_start(self, ctx: Any) -> None:
        if self.train_bar is not None:
            self.train_bar.set_description(f"train ep {ctx.timestamp.epoch}", refresh=False)

    def batch_end(self, ctx: Any) -> None:
        if self.train_bar is not None:
            # Follow the timestamp (host ints) rather than counting calls: exact after a resume.
            self.train_bar.update(ctx.timestamp.batch - self.train_bar.n)

    def eval_start(self, ctx: Any) -> None:
        if self.train_bar is None or self.eval_bar is not None:
            return
        self.eval_bar = tqdm(
            desc="eval", unit="ba", file=self.stream, dynamic_ncols=True, leave=False, position=1
        )

    def eval_batch_end(self, ctx: Any) -> None:
        if self.eval_bar is not None:
            self.eval_bar.update(1)

    def eval_end(self, ctx: Any) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None
        eval_metrics = getattr(ctx, "eval_metrics", None) or {}
        for key, value in eval_metrics.items():
            if isinstance(value, (int, float)):
                label = key if key.startswith(("eval", "val")) else f"eval_{key}"
                self._postfix[label] = format_value(float(value), self.digits)
        self._refresh_postfix()

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        for key, label in self.show.items():
            if key in values:
                self._postfix[label] = format_value(values[key], self.digits)
        self._refresh_postfix()

    def _refresh_postfix(self) -> None:
        if self.train_bar is not None and self._postfix:
            self.train_bar.set_postfix(self._postfix, refresh=False)

    def fit_end(self, ctx: Any) -> None:
        self.close()

    def close(self) -> None:
        for bar in (self.eval_bar, self.train_bar):
            if bar is not None:
                bar.close()
        self.eval_bar = self.train_bar = None
