"""`ProgressBar`: the run's progress -- a bar in a terminal, a periodic line anywhere else.

`fit` adds one by default (`progress=True`), so a run is never silent. In a terminal it draws a
tqdm bar counting batches towards the run's horizon, with tqdm's rate and ETA, the loss and
throughput of the loop's logging steps and the latest evaluation results, and an evaluation bar
under it while an evaluation runs. Elsewhere (a batch job's log file, a pipe, the ranks under
`python -m functrain.launch`, whose output the launcher copies line by line) a bar's carriage
returns would never reach the log, so it prints whole lines instead: one at most every
`line_every_sec` seconds, one at each epoch end (when the epoch took a second or more), and one
when the run ends. It never reads a device value:
numbers change only when the loop logs. It writes on rank 0 only.

It also prints the loop's status lines (`say`): where a run resumed, that a run had already
finished, that a run was stopped (and where its checkpoint is).

Example:
    >>> functrain.fit(step, state, loader, duration="3ep", loggers=[ProgressBar()])  # doctest: +SKIP
    train: epoch 1/3  batch 150/450 (33%)  loss 0.4321  eval_accuracy 0.97  38.2 ba/s  eta 0:00:07
"""

from __future__ import annotations

import datetime
import sys
import time as wallclock
from collections.abc import Sequence
from typing import Any, TextIO

import torch
from tqdm import tqdm

from .base import Logger, process_rank
from .console import format_value

# Metric key -> the short label shown in the bar.
DEFAULT_SHOWN = {
    "train/loss": "loss",  # as fit logs the step's metrics
    "loss": "loss",
    "train/accuracy": "acc",
    "throughput/samples_per_sec": "sp/s",
    "throughput/tokens_per_sec": "tok/s",
}


class ProgressBar(Logger):
    """Progress of training and evaluation: a bar in a terminal, lines elsewhere.

    Args:
        show: metric keys to show next to the bar (a sequence, or a `{key: label}` dict);
            evaluation metrics of `ctx.eval_metrics` are shown too.
        enabled: False turns it off; True draws a bar even when `stream` is not a terminal;
            None (default): a bar in a terminal, periodic lines elsewhere.
        stream: where to write (default: `sys.stderr`, as tqdm does).
        digits: significant digits of the numbers shown.
        line_every_sec: without a terminal, the most seconds between two lines (besides the
            line at each epoch end and at the end of the run).
    """

    def __init__(
        self,
        show: Sequence[str] | dict[str, str] | None = None,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        digits: int = 4,
        line_every_sec: float = 30.0,
    ):
        super().__init__(all_ranks=False)
        if show is None:
            show = DEFAULT_SHOWN
        self.show = dict(show) if isinstance(show, dict) else {k: k for k in show}
        self.enabled = enabled
        self.stream = stream
        self.digits = digits
        self.line_every_sec = float(line_every_sec)
        self.train_bar: tqdm | None = None
        self.eval_bar: tqdm | None = None
        self._postfix: dict[str, str] = {}
        self._lines = False  # printing lines (no terminal) for the current run
        self._start: tuple[float, int] | None = None  # (clock, batch) when the run started
        self._last_line = 0.0
        self._last_batch = -1  # the batch of the last line printed
        self._epochs = ""  # "/3" when the duration is in epochs

    # -- where and how ---------------------------------------------------------------------------

    def observe(self, ctx: Any) -> bool:
        super().observe(ctx)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # The global rank: under tensor parallelism several processes share dp rank 0.
            self._rank = process_rank()
        return self.active

    def _out(self) -> TextIO:
        return self.stream or sys.stderr

    def _mode(self, ctx: Any) -> str:
        """ "bar", "lines" or "off" for this run on this rank."""
        if not self.observe(ctx) or self.enabled is False:
            return "off"
        if self.enabled:
            return "bar"
        return "bar" if bool(getattr(self._out(), "isatty", lambda: False)()) else "lines"

    def say(self, text: str) -> None:
        """Print one status line (rank 0 only), above a running bar.

        Args:
            text: the line, without a trailing newline.
        """
        if self.active and self.enabled is not False:
            tqdm.write(f"functrain: {text}", file=self._out())
            self._out().flush()

    # -- training ---------------------------------------------------------------------------

    def fit_start(self, ctx: Any) -> None:
        mode = self._mode(ctx)
        ts = ctx.timestamp
        self._start, self._last_line = (wallclock.monotonic(), ts.batch), wallclock.monotonic()
        self._last_batch = -1
        duration = getattr(ctx, "duration", None)
        unit = getattr(getattr(duration, "unit", None), "value", None)
        self._epochs = ""
        if unit == "ep" and duration is not None:
            self._epochs = f"/{format_value(float(duration.value))}"
        self._lines = mode == "lines"
        if mode != "bar" or self.train_bar is not None:
            return
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
        elif self._lines and wallclock.monotonic() - self._last_line >= self.line_every_sec:
            self._line(ctx.timestamp)

    def epoch_end(self, ctx: Any) -> None:
        # A line per epoch, unless epochs take under a second (then the timed lines suffice).
        if self._lines and wallclock.monotonic() - self._last_line >= 1.0:
            self._line(ctx.timestamp)

    def _line(self, ts: Any, final: bool = False) -> None:
        """One progress line: position, the numbers last logged, the rate and the ETA."""
        now = wallclock.monotonic()
        self._last_line, self._last_batch = now, ts.batch
        if ts.max_batches:
            where = f"batch {ts.batch}/{ts.max_batches} ({100 * ts.batch / ts.max_batches:.0f}%)"
        else:
            where = f"batch {ts.batch}"
        parts = [f"epoch {ts.epoch}{self._epochs}", where]
        parts += [f"{label} {value}" for label, value in self._postfix.items()]
        start_clock, start_batch = self._start or (now, ts.batch)
        done = ts.batch - start_batch
        if done > 0 and now > start_clock:
            rate = done / (now - start_clock)
            parts.append(f"{rate:.3g} ba/s")
            if ts.max_batches and ts.batch < ts.max_batches and not final:
                eta = datetime.timedelta(seconds=round((ts.max_batches - ts.batch) / rate))
                parts.append(f"eta {eta}")
        tqdm.write(("train (end): " if final else "train: ") + "  ".join(parts), file=self._out())
        self._out().flush()

    # -- evaluation -------------------------------------------------------------------------

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
        ts = ctx.timestamp
        trained = ts is not None and self._start is not None and ts.batch > self._start[1]
        if self._lines and trained and ts.batch != self._last_batch:
            self._line(ts, final=True)
        self._lines = False
        self.close()

    def close(self) -> None:
        for bar in (self.eval_bar, self.train_bar):
            if bar is not None:
                bar.close()
        self.eval_bar = self.train_bar = None
