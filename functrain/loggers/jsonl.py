"""`JSONLLogger`: one JSON object per log call, appended to `RUN_DIR/metrics.jsonl`.

Each line is `{"step": ..., "time": ..., <metric>: <float>, ...}`; non-finite values are written
as the strings "nan", "inf", "-inf" so the file stays strict JSON. Lines are flushed as they are
written, so a killed run keeps everything it logged. A resumed run appends to the same file; its
re-logged steps come later in the file, and `read_metrics` lets the last value of a step win.
`python -m functrain.plot RUN_DIR` draws the curves from this file.

Example:
    >>> logger = JSONLLogger("run/metrics.jsonl")
    >>> logger.log_metrics({"loss": torch.tensor(0.25)}, step=10)
    >>> read_metrics("run/metrics.jsonl")["loss"]
    [(10, 0.25)]
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .base import json_number
from .run_dir import RunDirLogger, write_hparams_beside

DEFAULT_FILE_NAME = "metrics.jsonl"


class JSONLLogger(RunDirLogger):
    """Append metrics as JSON lines.

    Args:
        path: the file to append to. None: `<run_dir>/metrics.jsonl`, with `run_dir` taken from
            the loop's context at the first event.
        all_ranks: log on every rank; ranks other than 0 write `metrics.rank<r>.jsonl`.
    """

    default_name = DEFAULT_FILE_NAME
    location_arg = "path"
    location_kind = "file to write"

    def __init__(self, path: str | os.PathLike | None = None, *, all_ranks: bool = False):
        super().__init__(path, all_ranks=all_ranks)
        self._file = None

    @property
    def path(self) -> Path:
        """The file this logger writes (after rank suffixing)."""
        return self.location()

    def for_rank(self, path: Path, rank: int) -> Path:
        """Rank `rank` writes `<stem>.rank<r><suffix>` next to rank 0's file."""
        return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")

    def _open(self):
        if self._file is None:
            path = self.path
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # kept open: one line per log call
        return self._file

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update({k: json_number(v) for k, v in values.items() if k not in ("step", "time")})
        file = self._open()
        file.write(json.dumps(record) + "\n")
        file.flush()

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        write_hparams_beside(self.path, hparams)

    def fit_end(self, ctx: Any) -> None:
        self.close()  # a later fit call (or log call) reopens the file for appending

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def read_metrics(path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Read a JSONL metrics file into `{metric: [(step, value), ...]}`, sorted by step.

    When a step appears more than once for a metric (a resumed run re-logs the steps after its
    checkpoint), the last line wins. Malformed lines (a run killed mid-write) are skipped.

    Args:
        path: a file written by `JSONLLogger`.
    Returns:
        the series of every numeric metric.
    """
    series: dict[str, dict[int, float]] = {}
    with open(path, encoding="utf-8") as file:
        for line in file:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            step = record["step"]
            for key, value in record.items():
                if key in ("step", "time"):
                    continue
                number = _number(value)
                if number is not None:
                    series.setdefault(key, {})[step] = number
    return {key: sorted(points.items()) for key, points in series.items()}
