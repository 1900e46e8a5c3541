"""Where a matrix process's time goes: the marks the worker writes (read by `python -m bench
scenarios --profile`, which adds them up by phase over every launch).

Example:
    >>> timeline = Timeline("/dev/shm/run/batches/ddp")
    >>> timeline.mark("start", at=process_started())
    >>> timeline.mark("built", "ref.none.fp32.ddp.off.ba.plain")
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class Timeline:
    """Where a process's time goes: `(mark, wall time)` lines appended to
    `<batch>/timing/<pid>.jsonl` (read by `bench scenarios --profile`). Marks: `start` (before the
    imports), `imported`, `group` (process group, mesh and lockstep ready), per job `built`,
    `fit_start` (after any restore), `checkpoint` (each save handed over), `fit_end`, `final`
    (the final state written), and `exit`."""

    def __init__(self, batch_dir: str | None):
        self.path = None
        if batch_dir:
            folder = os.path.join(batch_dir, "timing")
            os.makedirs(folder, exist_ok=True)
            self.path = os.path.join(folder, f"{os.getpid()}.jsonl")

    def mark(self, name: str, job: str | None = None, at: float | None = None) -> None:
        if self.path:
            record = {"mark": name, "t": time.time() if at is None else at, "job": job}
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def process_started() -> float | None:
    """When this process started (wall time, from /proc to 10 ms; None elsewhere): the `start`
    mark, which so counts the interpreter's start and the imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return None
