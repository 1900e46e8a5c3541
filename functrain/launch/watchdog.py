"""The launcher's hang and straggler watchdog: names the rank that stopped, with its stack.

Each rank's `fit` publishes a heartbeat (`functrain.loop.heartbeat`: step, phase, when it last
moved) in the launcher's status folder. A thread of the launcher reads them every second. When a
rank has not moved for `--hang-timeout` (600 s by default; `0` turns the watchdog off), it:

1. asks every rank for its Python stacks: the worker wrapper registered `faulthandler` for
   SIGUSR1 (`arm_stack_dump`), which dumps every thread from C, so it works while the rank is
   blocked in a collective or a C++ call; the stacks are copied to `<dir>/rank<k>.txt`, where
   `<dir>` is `--hang-dir`, else `<run_dir>/hang-<time>` when `fit` has a local `run_dir`, else
   `./functrain-hang-<time>`;
2. prints one line naming the rank(s) that are behind, their step, phase and innermost frame of
   the script (`rank 1 stuck in forward-backward at step 5 (train.py:31 in loss_fn) for 600 s;
   ranks [0] wait in a collective (collectives.py:73 in wait)`); a rank is *waiting* when its
   stack shows a torch.distributed or functrain.parallel frame inside its innermost script
   frame, and when every rank waits, the line says so (a deadlock: a rank skipped or added a
   collective);
3. SIGKILLs every rank: torchrun restarts them when `--max-restarts` allows, else the launcher
   ends with `HANG_CODE` (124).

Stragglers: a rank whose mean step time (or time waiting for its next batch) over the last 20
steps stays above 1.5x the median of the others' for 3 looks in a row is named once in the log.
Under synchronous data parallelism every rank's step takes as long as the slowest rank's, so
there the data wait is what tells a slow rank apart.

Example:
    >>> watch = Watchdog(folder, timeout=600.0, hang_dir=None)
    >>> watch.start(); ...; watch.stop()
    >>> watch.hang   # the hang line, or None
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import re
import signal
import statistics
import threading
import time
from typing import IO, Any

from . import status

__all__ = ["HANG_CODE", "Watchdog", "arm_stack_dump", "parse_timeout", "read_heartbeats"]

HANG_CODE = 124  # the launcher's exit code after a hang (as `timeout` ends a command)
STACK_SIGNAL = signal.SIGUSR1
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_LIBRARY = ("/torch/", "/functrain/", "/site-packages/", "/dist-packages/", "<frozen")
_COLLECTIVES = ("/torch/distributed/", "/functrain/parallel/")  # a rank waiting for its peers
_STRAGGLER = 1.5  # x the median of the others
_STRAGGLER_LOOKS = 3
_WINDOW = 20  # steps a rank's times are averaged over (functrain.loop.heartbeat)
_NOISE = 0.01  # seconds: a difference below this is the machine's jitter, never a straggler  # consecutive looks over the line before a rank is named


class BadTimeout(argparse.ArgumentTypeError, ValueError):
    """A `--hang-timeout` that is not a duration (argparse prints this message as it is)."""


def parse_timeout(text: str) -> float:
    """Seconds from `"120s"`, `"10m"`, `"1h"` or a plain number; 0 turns the watchdog off."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(s|m|min|h)?\s*", str(text))
    if match is None:
        raise BadTimeout(
            f"--hang-timeout {text!r} is not a duration: give seconds ('600', '120s'), minutes "
            "('10m') or hours ('1h'), or 0 to turn the hang watchdog off"
        )
    scale = {"m": 60, "min": 60, "h": 3600}.get(match.group(2) or "s", 1)
    return float(match.group(1)) * scale


def arm_stack_dump() -> IO[str] | None:
    """In a rank: dump every thread's Python stack to the status folder on SIGUSR1.

    Returns:
        the open stack file (keep it: faulthandler writes to its descriptor), or None outside a
        launch.
    """
    folder = os.environ.get(status.STATUS_ENV)
    if not folder or not os.path.isdir(folder):
        return None
    path = os.path.join(folder, f"stacks.rank{os.environ.get('RANK', '0')}.txt")
    out = open(path, "a")  # append: the launcher truncates it before each request
    faulthandler.register(STACK_SIGNAL, file=out, all_threads=True)
    return out


def read_heartbeats(folder: str) -> dict[int, dict]:
    """The ranks' newest heartbeats in `folder`, by rank (unreadable files are skipped)."""
    beats: dict[int, dict] = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = re.fullmatch(r"heartbeat\.rank(\d+)\.json", name)
        if match is None:
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                value = json.load(f)
        except (ValueError, OSError):
            continue
        if isinstance(value, dict):
            beats[int(match.group(1))] = value
    return beats


def main_stack(text: str) -> list[tuple[str, int, str]]:
    """The main thread's frames (innermost first) in a faulthandler dump: the thread that runs
    the script (through runpy), else the first thread listed."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if "(most recent call first)" in line:
            threads.append([])
        elif threads and (match := _FRAME.match(line)):
            threads[-1].append((match["file"], int(match["line"]), match["func"]))
    for frames in threads:
        if any("runpy" in f for f, _, _ in frames):
            return frames
    return threads[0] if threads else []


def _is_script(path: str) -> bool:
    stdlib = os.path.dirname(os.__file__)
    return not (path.startswith(stdlib) or any(part in path for part in _LIBRARY))


def where(frames: list[tuple[str, int, str]]) -> tuple[str, str | None]:
    """`("train.py:31 in loss_fn", collective)`: the innermost frame of the script (else the
    innermost frame), and the torch.distributed function the rank waits in below it, if any."""
    waits = None
    for file, line, func in frames:
        if _is_script(file):
            return f"{os.path.basename(file)}:{line} in {func}", waits
        if waits is None and any(part in file for part in _COLLECTIVES):
            waits = f"{os.path.basename(file)}:{line} in {func}"
    if not frames:
        return "no stack", None
    file, line, func = frames[0]
    return f"{os.path.basename(file)}:{line} in {func}", waits


def hang_line(
    beats: dict[int, dict], stacks: dict[int, str], now: float, folder: str, timeout: float = 0.0
) -> str:
    """The line naming the ranks that are behind (see the module's docstring); a rank that
    neither waits nor stood still for `timeout` seconds is named as running."""
    info = {}
    for rank, beat in sorted(beats.items()):
        frame, waits = where(main_stack(stacks.get(rank, "")))
        info[rank] = (beat, frame, waits)

    def said(rank: int) -> str:
        beat, frame, _ = info[rank]
        return f"{beat.get('phase')} at step {beat.get('step')} ({frame})"

    def idle(rank: int) -> int:
        return round(now - info[rank][0].get("since", now))

    waiting = [r for r in info if info[r][2] is not None]
    running = [r for r in info if r not in waiting and 0 < timeout and idle(r) < timeout]
    stuck = [r for r in info if r not in waiting and r not in running]
    if stuck:
        parts = [f"rank {r} stuck in {said(r)} for {idle(r)} s" for r in stuck]
        line = "; ".join(parts)
        if waiting:
            names = sorted({info[r][2] or "" for r in waiting})
            line += f"; ranks {waiting} wait in a collective ({', '.join(names)})"
        if running:
            line += f"; ranks {running} are running"
    elif waiting:
        parts = [f"rank {r} in {said(r)} waits in a collective ({info[r][2]})" for r in waiting]
        line = "every rank waits in a collective, a deadlock (a rank skipped or added one): "
        line += "; ".join(parts) + f" for {max(idle(r) for r in waiting)} s"
    else:  # only ranks that move: a hang seen a moment too late
        line = f"ranks {running} are running again"
    return f"functrain.launch: hang: {line}; stacks in {folder}"


def stragglers(beats: dict[int, dict]) -> dict[int, str]:
    """Ranks whose step time or data wait is above 1.5x the median of the others', with why."""
    named: dict[int, str] = {}
    for key, what in (("step_sec", "step time"), ("data_sec", "wait for the next batch")):
        times = {r: b[key] for r, b in beats.items() if isinstance(b.get(key), (int, float))}
        if len(times) < 2:
            continue
        for rank, value in times.items():
            median = statistics.median(v for r, v in times.items() if r != rank)
            if value > _STRAGGLER * median and value - median > _NOISE:
                named.setdefault(rank, f"{what} {value:.3g} s against {median:.3g} s (median)")
    return named


class Watchdog:
    """The launcher's thread that watches the ranks' heartbeats in the status folder.

    Args:
        folder: the launcher's status folder.
        timeout: seconds without progress that make a hang (0: only stragglers are watched).
        hang_dir: where the stacks go (None: the run's directory or the current one).
        poll: seconds between looks.
    """

    def __init__(self, folder: str, timeout: float, hang_dir: str | None, poll: float = 1.0):
        self.folder, self.timeout, self.hang_dir, self.poll = folder, timeout, hang_dir, poll
        self.hang: str | None = None  # the line of a hang in the current attempt
        self._attempt = 0
        self._slow: dict[int, int] = {}
        self._said: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="functrain-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._done.wait(self.poll):
            try:
                self.look(time.time())
            except Exception as error:  # never let the watchdog end the launch
                status.print_line(f"functrain.launch: the hang watchdog failed: {error!r}")
                return

    def look(self, now: float) -> None:
        """One look at the heartbeats: a hang is handled, stragglers are named."""
        beats = read_heartbeats(self.folder)
        beats = {r: b for r, b in beats.items() if b.get("attempt", 0) >= self._attempt}
        newer = [b.get("attempt", 0) for b in beats.values() if b.get("attempt", 0) > self._attempt]
        if newer:  # torchrun restarted the ranks: what counts now is the new attempt
            self._attempt, self.hang = max(newer), None
            self._slow.clear()
            self._said.clear()
            beats = {r: b for r, b in beats.items() if b.get("attempt", 0) == self._attempt}
        live = {r: b for r, b in beats.items() if b.get("phase") != "done"}
        self._stragglers(live)
        if self.timeout <= 0 or self.hang is not None:
            return
        if any(now - b.get("since", now) > self.timeout for b in live.values()):
            self._on_hang(live, now)

    def _stragglers(self, beats: dict[int, dict]) -> None:
        now = time.time()

        def fresh(beat: dict) -> bool:  # a rank that stopped moving is a hang's, not slow
            return now - beat.get("since", now) < max(10 * (beat.get("step_sec") or 0), 5.0)

        slow = stragglers(
            {r: b for r, b in beats.items() if b.get("steps_timed", 0) >= _WINDOW and fresh(b)}
        )
        self._slow = {r: self._slow.get(r, 0) + 1 for r in slow}
        for rank, why in slow.items():
            if self._slow[rank] >= _STRAGGLER_LOOKS and rank not in self._said:
                self._said.add(rank)
                status.print_line(
                    f"functrain.launch: rank {rank} is a straggler: {why} of the other ranks, "
                    f"over its last 20 steps (at step {beats[rank].get('step')})"
                )

    def _on_hang(self, beats: dict[int, dict], now: float) -> None:
        folder = self._hang_folder(beats, now)
        stacks = self._collect_stacks(beats, folder)
        self.hang = hang_line(beats, stacks, now, folder, self.timeout)
        status.print_line(self.hang + "; stopping every rank")
        for beat in beats.values():
            _kill(beat.get("pid"))
        for name in os.listdir(self.folder):  # the next attempt starts from no heartbeat
            if name.startswith("heartbeat."):
                try:
                    os.remove(os.path.join(self.folder, name))
                except OSError:
                    pass

    def _hang_folder(self, beats: dict[int, dict], now: float) -> str:
        stamp = datetime.datetime.fromtimestamp(now).strftime("%Y%m%d-%H%M%S")
        if self.hang_dir is not None:
            return os.path.join(self.hang_dir, f"hang-{stamp}")
        run_dirs = [b.get("run_dir") for _, b in sorted(beats.items()) if b.get("run_dir")]
        if run_dirs and "://" not in str(run_dirs[0]):
            return os.path.join(str(run_dirs[0]), f"hang-{stamp}")
        return os.path.abspath(f"functrain-hang-{stamp}")

    def _collect_stacks(self, beats: dict[int, dict], folder: str) -> dict[int, str]:
        """Ask every rank for its stacks; `{rank: dump}`, also written to `folder/rank<k>.txt`."""
        paths = {r: os.path.join(self.folder, f"stacks.rank{r}.txt") for r in beats}
        for path in paths.values():
            try:
                open(path, "w").close()  # the rank appends: this request's dump starts at 0
            except OSError:
                pass
        for beat in beats.values():
            _signal(beat.get("pid"), STACK_SIGNAL)
        # faulthandler writes from C at once; wait until every file is written and stays so
        sizes: dict[int, int] = {}
        deadline = time.time() + 5.0
        while time.time() < deadline:
            time.sleep(0.25)
            now = {r: _size(p) for r, p in paths.items()}
            if all(now.values()) and now == sizes:
                break
            sizes = now
        stacks: dict[int, str] = {}
        os.makedirs(folder, exist_ok=True)
        for rank, path in paths.items():
            stacks[rank] = _read(path)
            with open(os.path.join(folder, f"rank{rank}.txt"), "w") as f:
                f.write(stacks[rank] or "(no stack: the rank did not answer SIGUSR1)\n")
        return stacks


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _signal(pid: Any, sig: int) -> None:
    if isinstance(pid, int) and pid > 0 and pid != os.getpid():
        try:
            os.kill(pid, sig)
        except OSError:  # it ended meanwhile
            pass


def _kill(pid: Any) -> None:
    """SIGKILL a rank (torchrun then sees it failed, and restarts or stops the others)."""
    _signal(pid, signal.SIGKILL)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
