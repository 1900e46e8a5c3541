"""`RunDirLogger`: a logger that writes where it is told, or else inside the loop's run directory.

File-based loggers (JSONL, TensorBoard) take an explicit location, or none: then they write to a
fixed name inside `fit(..., run_dir=...)`, which they learn from the loop's context at the first
event. Ranks other than 0 (with `all_ranks=True`) get a location of their own, so no two processes
append to the same file. A logger that has neither fails at FIT_START, not at its first log line.

Example:
    >>> class TextLogger(RunDirLogger):
    ...     default_name, location_arg, location_kind = "log.txt", "path", "file to write"
    ...     def write_metrics(self, values, step):
    ...         self.location().write_text(f"{step}: {values}")
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .base import Logger


class RunDirLogger(Logger):
    """Base class for loggers writing to a file or directory, by default inside the run directory.

    Subclasses set `default_name` (the name inside the run directory), `location_arg` (their
    constructor argument for an explicit location) and `location_kind` (what the location is, for
    the error message), and may override `for_rank` (how another rank's location is derived).

    Args:
        location: the file or directory to write. None: `<run_dir>/<default_name>`, with
            `run_dir` taken from the loop's context at the first event.
        all_ranks: log on every rank, not only on rank 0.
    """

    default_name: str = ""
    location_arg: str = "location"
    location_kind: str = "location"

    def __init__(self, location: str | os.PathLike | None = None, *, all_ranks: bool = False):
        super().__init__(all_ranks=all_ranks)
        self._given = Path(location) if location is not None else None
        self._run_dir: Path | None = None

    def observe(self, ctx: Any) -> bool:
        run_dir = getattr(ctx, "run_dir", None)
        if run_dir is not None and self._run_dir is None:
            self._run_dir = Path(run_dir)
        return super().observe(ctx)

    def fit_start(self, ctx: Any) -> None:
        if self.observe(ctx):
            self.location()  # fail at the start of the run, not at its first log line

    def location(self) -> Path:
        """Where this rank writes: the given location or the run directory's, made per-rank.

        Returns:
            the path (rank 0: the location itself; rank r: `for_rank(location, r)`).
        Raises:
            ValueError: neither a location nor a run directory was given.
        """
        if self._given is not None:
            path = self._given
        elif self._run_dir is not None:
            path = self._run_dir / self.default_name
        else:
            name = type(self).__name__
            raise ValueError(
                f"{name} has no {self.location_kind}: pass {name}({self.location_arg}=...) or "
                "give the loop a run directory (functrain.fit(..., run_dir=...))"
            )
        return self.for_rank(path, self.rank) if self.rank != 0 else path

    def for_rank(self, path: Path, rank: int) -> Path:
        """The location of rank `rank` (not 0) derived from rank 0's: a `rank<r>` subdirectory."""
        return path / f"rank{rank}"


HPARAMS_FILE_NAME = "hparams.json"


def write_hparams_beside(path: Path, hparams: dict[str, Any]) -> None:
    """Write `hparams` as `hparams.json` in the folder of a logger's file `path` (JSON, sorted).

    Args:
        path: the logger's own file (metrics.jsonl, metrics.csv, ...).
        hparams: the run's hyperparameters; values JSON cannot hold are written as their repr.
    Example:
        >>> write_hparams_beside(Path("runs/a/metrics.csv"), {"lr": 1e-3})
    """
    out = path.with_name(HPARAMS_FILE_NAME)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(hparams, indent=2, sort_keys=True, default=repr) + "\n")
