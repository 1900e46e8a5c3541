"""`ConsoleLogger`: one readable line per logging step.

Lines go through `tqdm.write`, so they print above a running `ProgressBar` instead of through it.
Evaluation results always print, whatever the interval.

Example:
    >>> logger = ConsoleLogger()
    >>> logger.log_metrics({"loss": 0.25, "lr": 1e-3}, step=100)
    [step 100] loss 0.25  lr 0.001
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from tqdm import tqdm

from ..callbacks.interval import Trigger
from ..units import TimeLike, Timestamp
from .base import Logger


def format_value(value: float, digits: int = 4) -> str:
    """A short human form of `value` ("0.2512", "1e-05", "12345", "nan")."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{digits}g}"


class ConsoleLogger(Logger):
    """Print metrics to the console.

    Args:
        interval: print only on training steps that fall on this interval ("100ba", "1ep");
            None prints every time the loop logs. Evaluation results always print.
        stream: where to print (default: `sys.stdout`).
        digits: significant digits shown.
        all_ranks: print on every rank, each line prefixed by the rank.
    """

    def __init__(
        self,
        interval: TimeLike | None = None,
        *,
        stream: TextIO | None = None,
        digits: int = 4,
        all_ranks: bool = False,
    ):
        super().__init__(all_ranks=all_ranks)
        self.interval = Trigger(interval) if interval is not None else None
        self.stream = stream
        self.digits = digits
        self._timestamp: Timestamp | None = None
        self._decided_step: int | None = None
        self._print_step = True
        self._in_eval = False

    def _note(self, ctx: Any) -> None:
        self.observe(ctx)
        timestamp = getattr(ctx, "timestamp", None)
        if timestamp is not None:
            self._timestamp = timestamp

    def fit_start(self, ctx: Any) -> None:
        self._note(ctx)

    def batch_start(self, ctx: Any) -> None:
        self._in_eval = False

    def batch_end(self, ctx: Any) -> None:
        self._note(ctx)

    def eval_start(self, ctx: Any) -> None:
        self._note(ctx)
        self._in_eval = True  # eval results print even off the interval

    def fit_end(self, ctx: Any) -> None:
        self._note(ctx)
        self._in_eval = True  # so do the final numbers
        reason = getattr(ctx, "stop_reason", None)
        if reason and self.active:  # say why a run ended before its duration
            tqdm.write(f"[stopped] {reason}", file=self.stream or sys.stdout)

    def _wanted(self, step: int) -> bool:
        if self.interval is None or self._in_eval:
            return True
        if step != self._decided_step:
            # The interval is decided once per step, so every log call of a step agrees.
            timestamp = (self._timestamp or Timestamp()).replace(batch=step)
            self._decided_step = step
            self._print_step = self.interval.due(timestamp)
        return self._print_step

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        if not self._wanted(step):
            return
        prefix = f"[rank {self.rank}] " if self.all_ranks else ""
        body = "  ".join(f"{k} {format_value(v, self.digits)}" for k, v in values.items())
        tqdm.write(f"{prefix}[step {step}] {body}", file=self.stream or sys.stdout)

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        body = "  ".join(f"{k}={v!r}" for k, v in hparams.items())
        tqdm.write(f"[hparams] {body}", file=self.stream or sys.stdout)
