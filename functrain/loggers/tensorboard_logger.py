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

from .base import import_optional
from .run_dir import RunDirLogger

DEFAULT_DIR_NAME = "tensorboard"


class TensorBoardLogger(RunDirLogger):
    """Write TensorBoard event files.

    Args:
        log_dir: the event file directory. None: `<run_dir>/tensorboard` from the loop's context.
        flush_secs: how often the writer flushes to disk by itself.
        all_ranks: log on every rank; ranks other than 0 write to `<log_dir>/rank<r>`.
    """

    default_name = DEFAULT_DIR_NAME
    location_arg = "log_dir"
    location_kind = "directory"

    def __init__(
        self, log_dir: str | os.PathLike | None = None, *, flush_secs: int = 30, all_ranks=False
    ):
        super().__init__(log_dir, all_ranks=all_ranks)
        self.flush_secs = flush_secs
        self._writer = None

    @property
    def log_dir(self) -> Path:
        """The directory holding this rank's event files."""
        return self.location()

    @property
    def writer(self):
        """The `SummaryWriter`, created on first use."""
        if self._writer is None:
            tensorboard = import_optional(  # tensorboard is an optional dependency
                "torch.utils.tensorboard",
                "TensorBoardLogger needs the tensorboard package: pip install tensorboard",
            )
            self._writer = tensorboard.SummaryWriter(
                log_dir=str(self.log_dir), flush_secs=self.flush_secs
            )
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
