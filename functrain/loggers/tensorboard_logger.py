"""`TensorBoardLogger`: scalars, hyperparameters and images as TensorBoard event files.

Written with `torch.utils.tensorboard.SummaryWriter` (needs the `tensorboard` package); view them
with `tensorboard --logdir RUN_DIR/tensorboard`.

Example:
    >>> logger = TensorBoardLogger("runs/exp1")
    >>> logger.log_metrics({"loss": torch.tensor(0.25)}, step=10)
    >>> logger.close()
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .base import Logger

DEFAULT_DIR_NAME = "tensorboard"


class TensorBoardLogger(Logger):
    """Write TensorBoard event files.

    Args:
        log_dir: the event file directory. None: `<run_dir>/tensorboard` from the loop's context.
        flush_secs: how often the writer flushes to disk by itself.
        all_ranks: log on every rank; ranks other than 0 write to `<log_dir>/rank<r>`.
    """

    def __init__(
        self, log_dir: str | os.PathLike | None = None, *, flush_secs: int = 30, all_ranks=False
    ):
        super().__init__(all_ranks=all_ranks)
        self._given = Path(log_dir) if log_dir is not None else None
        self._run_dir: Path | None = None
        self.flush_secs = flush_secs
        self._writer = None

    def observe(self, ctx: Any) -> bool:
        run_dir = getattr(ctx, "run_dir", None)
        if run_dir is not None and self._run_dir is None:
            self._run_dir = Path(run_dir)
        return super().observe(ctx)

    def fit_start(self, ctx: Any) -> None:
        if self.observe(ctx):
            _ = self.log_dir  # fail at the start of the run, not at its first log line

    @property
    def log_dir(self) -> Path:
        """The directory holding this rank's event files."""
        if self._given is not None:
            path = self._given
        elif self._run_dir is not None:
            path = self._run_dir / DEFAULT_DIR_NAME
        else:
            raise ValueError(
                "TensorBoardLogger has no directory: pass TensorBoardLogger(log_dir=...) or give "
                "the loop a run directory (functrain.fit(..., run_dir=...))"
            )
        return path / f"rank{self.rank}" if self.rank != 0 else path

    @property
    def writer(self):
        """The `SummaryWriter`, created on first use."""
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:  # tensorboard is an optional dependency
                raise ImportError(
                    "TensorBoardLogger needs the tensorboard package: pip install tensorboard"
                ) from error
            self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=self.flush_secs)
        return self._writer

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        # A text summary keeps every value (add_hparams would start a separate run directory).
        rows = "\n".join(f"| {k} | {json.dumps(v, default=repr)} |" for k, v in hparams.items())
        self.writer.add_text("hparams", "| name | value |\n|---|---|\n" + rows, global_step=0)

    def write_images(self, name: str, images: np.ndarray, step: int) -> None:
        self.writer.add_images(name, images, global_step=step, dataformats="NHWC")

    def epoch_end(self, ctx: Any) -> None:
        if self._writer is not None:
            self._writer.flush()

    def fit_end(self, ctx: Any) -> None:
        self.close()  # a later fit call (or log call) opens a new event file in the directory

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
