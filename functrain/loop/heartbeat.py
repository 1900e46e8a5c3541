"""A rank's heartbeat for the launcher's hang watchdog: its step, phase and when it last moved.

Under `python -m functrain.launch` (`FUNCTRAIN_LAUNCH_STATUS` names the launcher's status folder)
`fit` tells its `Heartbeat` of every loop event; the heartbeat keeps the newest
`(step, phase, time)` in memory and a daemon thread writes it to `heartbeat.rank<R>.json` in that
folder at most four times a second (atomic replace, no fsync), so the loop itself never touches
the disk. The thread also writes while the loop is blocked in C++ (a collective, a sleep), since
such calls release the GIL. Phases: setup, data, forward-backward (the whole step: forward,
backward, the gradient collectives and the optimizer), checkpoint, eval, done. Outside a launch
`Heartbeat.of_launch` returns a heartbeat that does nothing.

The launcher's side (functrain.launch.watchdog) reads these files; the package may not import
the launcher, so the file's format is written here.

Example:
    >>> beat = Heartbeat.of_launch(run_dir=None)   # in FitRun
    >>> beat.beat(Event.BATCH_START, 5)            # in FitRun._emit: "forward-backward", step 5
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from typing import Any

from .events import Event
from .launch_record import STATUS_ENV

__all__ = ["PHASES", "Heartbeat"]

# The phase a rank is in after each event (events not listed keep the phase).
PHASES = {
    Event.INIT: "setup",
    Event.FIT_START: "data",
    Event.EPOCH_START: "data",
    Event.BATCH_START: "forward-backward",
    Event.BATCH_END: "data",
    Event.EVAL_START: "eval",
    Event.EVAL_END: "data",
    Event.CHECKPOINT: "data",
    Event.FIT_END: "done",
}
_WINDOW = 20  # steps over which step and data times are averaged (the straggler check)


class Heartbeat:
    """The newest step and phase of this rank, published for the launcher.

    Args:
        path: the file to write (None: publish nothing).
        run_dir: the run's directory, told to the launcher (its hang reports go there).
        interval: seconds between the writer thread's looks at the state.
    """

    def __init__(self, path: str | None, run_dir: str | None = None, interval: float = 0.25):
        self.path, self.run_dir, self.interval = path, run_dir, interval
        self._step, self._phase, self._since = 0, "setup", time.time()
        self._starts: collections.deque[float] = collections.deque(maxlen=_WINDOW + 1)
        self._waits: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self._data_since: float | None = None
        self._version = 0
        self._thread: threading.Thread | None = None
        self._owner: tuple[int, Any] | None = None  # (thread id, frame of FitRun.run)

    @classmethod
    def of_launch(cls, run_dir: str | None) -> Heartbeat:
        """This rank's heartbeat under the launcher; one that does nothing outside it."""
        folder = os.environ.get(STATUS_ENV, "")
        if not folder or not os.path.isdir(folder):
            return cls(None)
        rank = os.environ.get("RANK", "0")
        return cls(os.path.join(folder, f"heartbeat.rank{rank}.json"), run_dir)

    def beat(self, event: Event, step: int) -> None:
        """Note a loop event at `step` (every event is progress; some change the phase)."""
        if self.path is None:
            return
        now = time.time()
        if event is Event.BATCH_START:
            self._starts.append(now)
            if self._data_since is not None:
                self._waits.append(now - self._data_since)
        elif event is Event.BATCH_END:
            self._data_since = now
        self.phase(PHASES.get(event, self._phase), step, now)

    def phase(self, name: str, step: int, now: float | None = None) -> None:
        """Enter phase `name` at `step` (e.g. "checkpoint" before a save)."""
        if self.path is None:
            return
        self._step, self._phase = step, name
        self._since = time.time() if now is None else now
        self._version += 1
        if self._thread is None:
            self._owner = _run_frame(self)
            self._thread = threading.Thread(target=self._write_loop, daemon=True)
            self._thread.start()

    def record(self) -> dict:
        """What the file holds: rank, pid, restart attempt, step, phase, since, step/data times."""
        starts = list(self._starts)
        step_sec = (starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else None
        waits = list(self._waits)
        return {
            "rank": int(os.environ.get("RANK", "0")),
            "pid": os.getpid(),
            "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "step": self._step,
            "phase": self._phase,
            "since": self._since,
            "time": time.time(),
            "step_sec": step_sec,
            "data_sec": sum(waits) / len(waits) if waits else None,
            "steps_timed": max(len(starts) - 1, 0),
            "run_dir": self.run_dir,
        }

    def _running(self) -> bool:
        """Whether the fit is still on its thread's stack (a fit that raised publishes "done":
        the script may go on with anything, e.g. the next test of a suite, for any time)."""
        if self._owner is None:
            return True
        tid, owner = self._owner
        frame = sys._current_frames().get(tid)
        while frame is not None:
            if frame is owner:
                return True
            frame = frame.f_back
        return False

    def _write_loop(self) -> None:
        written = -1
        while True:
            if self._phase != "done" and not self._running():
                self._phase = "done"
                self._version += 1
            version, done = self._version, self._phase == "done"
            if version != written:
                self._write(self.record())
                written = version
            if done:
                return  # the run is over: nothing more to tell
            time.sleep(self.interval)

    def _write(self, record: dict) -> None:
        assert self.path is not None
        tmp = f"{self.path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)  # the launcher never reads half a record
        except OSError:  # the launcher's folder is gone: nothing to tell
            pass


def _run_frame(beat: Heartbeat) -> tuple[int, Any] | None:
    """The calling thread and the frame of the `FitRun.run` that owns `beat` (None: not found)."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "run" else None
        if getattr(owner, "beat", None) is beat:
            return threading.get_ident(), frame
        frame = frame.f_back
    return None
