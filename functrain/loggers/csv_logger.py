"""`CSVLogger`: one row per logged step in `RUN_DIR/metrics.csv`, as Lightning's CSVLogger writes.

The columns are `step` and then every metric name, in the order they first appeared. Calls for
the same step as the last row (train and eval metrics of one step, logged separately) fill that
row instead of starting a new one. A metric that appears later (the first eval, a new monitor)
rewrites the file with the wider header -- as Lightning does -- so every row has every column,
blank where a metric was not logged. Rows are flushed as they are written, so a killed run keeps
what it logged; a resumed run appends to the same file, keeping its header, and its re-logged
steps come later in the file (the last row of a step is the latest value). Non-finite values
are written as `nan`, `inf`, `-inf`, which `float()` reads back.

Example:
    >>> logger = CSVLogger("run/metrics.csv")
    >>> logger.log_metrics({"train/loss": torch.tensor(0.5)}, step=1)
    >>> logger.log_metrics({"train/loss": 0.25, "eval/accuracy": 0.75}, step=2)
    >>> logger.close()
    >>> print(Path("run/metrics.csv").read_text(), end="")
    step,train/loss,eval/accuracy
    1,0.5,
    2,0.25,0.75
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from .run_dir import RunDirLogger, write_hparams_beside

DEFAULT_FILE_NAME = "metrics.csv"


def _row_bytes(header: list[str], row: dict[str, Any]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([row.get(c, "") for c in header])
    return buffer.getvalue().encode("utf-8")


class CSVLogger(RunDirLogger):
    """Write metrics as CSV rows, one per step, with the union of metric names as columns.

    Args:
        path: the CSV file. None: `<run_dir>/metrics.csv`, with `run_dir` taken from the loop's
            context at the first event.
        all_ranks: log on every rank; ranks other than 0 write `metrics.rank<r>.csv`.
    Example:
        >>> functrain.fit(step, state, loader, run_dir="runs/a", loggers=[CSVLogger()])
    """

    default_name = DEFAULT_FILE_NAME
    location_arg = "path"
    location_kind = "file to write"

    def __init__(self, path: str | os.PathLike | None = None, *, all_ranks: bool = False):
        super().__init__(path, all_ranks=all_ranks)
        self._file: Any = None
        self._header: list[str] = []
        # The last row, and where it starts in the file, so that a later call for the same
        # step rewrites it in place (one row per step).
        self._last: dict[str, Any] | None = None
        self._last_offset = 0

    @property
    def path(self) -> Path:
        """The file this logger writes (after rank suffixing)."""
        return self.location()

    def for_rank(self, path: Path, rank: int) -> Path:
        """Rank `rank` writes `<stem>.rank<r><suffix>` next to rank 0's file."""
        return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")

    def _open(self) -> Any:
        if self._file is None:
            path = self.path
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > 0:
                with open(path, encoding="utf-8", newline="") as existing:
                    self._header = next(csv.reader(existing), []) or ["step"]
            self._file = open(path, "ab")  # binary: byte offsets for rewriting the last row
            if not self._header:
                self._header = ["step"]
                self._file.write(_row_bytes(self._header, {"step": "step"}))
            self._last = None  # a reopened file's last row is not ours to merge into
        return self._file

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        file = self._open()
        values = {k: v for k, v in values.items() if k != "step"}
        last = self._last
        merged = last is not None and last["step"] == step
        row = {**last, **values} if last is not None and merged else {"step": step, **values}
        if not merged:
            self._last_offset = file.tell()
        new = [k for k in values if k not in self._header]
        if new:
            self._header += new
            self._rewrite(row, replace_last=merged)
        else:
            file.truncate(self._last_offset)  # a no-op unless the last row is being refilled
            file.write(_row_bytes(self._header, row))
        self._file.flush()
        self._last = row

    def _rewrite(self, row: dict[str, Any], *, replace_last: bool) -> None:
        """Rewrite the file under the widened header, ending with `row`."""
        self._file.flush()
        path = self.path
        with open(path, encoding="utf-8", newline="") as old:
            rows = list(csv.DictReader(old))
        if replace_last and rows:
            rows.pop()  # the same step's row, which `row` now holds in full
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(_row_bytes(self._header, {c: c for c in self._header}))
            for old_row in rows:
                out.write(_row_bytes(self._header, old_row))
            self._last_offset = out.tell()
            out.write(_row_bytes(self._header, row))
        self._file.close()
        os.replace(tmp, path)  # atomic: a kill mid-rewrite leaves the old file whole
        self._file = open(path, "ab")

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        write_hparams_beside(self.path, hparams)

    def fit_end(self, ctx: Any) -> None:
        self.close()  # a later fit call (or log call) reopens the file for appending

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._last = None
