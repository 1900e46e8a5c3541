"""What the ranks tell `functrain.launch`, and the one line the launcher ends with.

Under the launcher each rank leaves two small JSON records in a folder the launcher names
(`FUNCTRAIN_LAUNCH_STATUS`; nothing is written outside a launch):

- `rank<R>.checkpoint.json` (R: the global rank): the newest checkpoint that rank's `fit`
  committed (step, URL, time), rewritten at each commit by `functrain.loop.launch_record`;
- `rank<R>.exit.json`: written by the worker wrapper when the script ends: its exit code, the
  stop signals (SIGTERM, SIGINT) the process received while a Python handler (fit's) caught them,
  and the error it raised, if any.

A rank that was killed writes no exit record. From these and torchrun's failures the launcher
names the rank that failed first (a rank stopped because a peer died never is), or says how a
stop ended: "stopped by SIGTERM; all 2 ranks checkpointed at step 7 and exited".

Example:
    >>> record_commit(7, "file:///runs/a/step_000000007")  # in a rank (functrain.loop.launch_record)
    >>> records = read_records(folder)                            # in the launcher
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..loop.launch_record import STATUS_ENV

__all__ = [
    "STATUS_ENV",
    "RankRecord",
    "SignalLog",
    "exit_code_of",
    "failure_line",
    "first_stop",
    "own_codes",
    "raised_error",
    "read_records",
    "root_failure",
    "stop_line",
    "with_recorded_errors",
    "write_exit_record",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# Errors a rank gets because *another* rank died: never the one to report.
_SECONDARY = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker",  # gloo: "... remote worker crashing" / "check the logs of the remote worker"
    "Broken pipe",
    "NCCL communicator was aborted",
    "DistNetworkError",
)
# The exit codes of a script whose `fit` was stopped by a signal (`FitResult.exit_code`).
_STOP_CODES = (75, 128 + signal.SIGINT, 128 + signal.SIGTERM)
# What torchrun writes as a failure's message when the rank left none of its own.
_MADE_UP = ("To enable traceback", "received by PID")


# -- in a rank ---------------------------------------------------------------------------------


def _record_path(kind: str) -> str | None:
    folder = os.environ.get(STATUS_ENV)
    if not folder or not os.path.isdir(folder):
        return None
    return os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.{kind}.json")


def _write_json(path: str, value: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)  # the launcher never reads half a record


class SignalLog:
    """Which stop signals this process caught, without replacing anyone's handler.

    Python writes each caught signal's number to a wakeup file descriptor, whichever Python
    handler (fit's SIGTERM handler, say) then runs; a pipe serves as that descriptor.
    """

    def __init__(self):
        self._read = self._write = -1
        try:
            self._read, self._write = os.pipe()
            os.set_blocking(self._read, False)
            os.set_blocking(self._write, False)
            signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except (OSError, ValueError):  # not the main thread, or no pipes: stay blind
            self._read = self._write = -1

    def received(self) -> list[str]:
        """Names of the stop signals caught so far (in order, without repeats)."""
        if self._read < 0:
            return []
        try:
            data = os.read(self._read, 4096)
        except (BlockingIOError, OSError):
            data = b""
        names = []
        for number in data:
            if number in STOP_SIGNALS and signal.Signals(number).name not in names:
                names.append(signal.Signals(number).name)
        return names


def write_exit_record(
    code: int, signals: list[str], stop_time: float | None = None, error: str | None = None
) -> None:
    """Tell the launcher (if any) that this rank's script ended with `code` (and, for a stop
    forwarded as a hangup, when the rank was asked to stop; `error`: what it raised)."""
    path = _record_path("exit")
    if path is not None:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        record = {"code": int(code), "signals": signals, "local_rank": local, "time": time.time()}
        if stop_time is not None:
            record["stop_time"] = stop_time
        if error:
            record["error"] = error
        try:
            _write_json(path, record)
        except OSError:
            pass


def raised_error() -> str | None:
    """The error the script is ending with ("ValueError: boom"), read in the worker's `finally`
    while it propagates; None when the script returned or called `sys.exit`."""
    error = sys.exc_info()[1]
    if error is None or isinstance(error, SystemExit):
        return None
    return "".join(traceback.format_exception_only(type(error), error)).strip()


# -- in the launcher ---------------------------------------------------------------------------


@dataclass
class RankRecord:
    """What one rank left: its exit (None: it was killed) and its newest checkpoint."""

    rank: int
    exit: dict | None = None
    checkpoint: dict | None = None
    signals: list[str] = field(default_factory=list)


def read_records(folder: str) -> dict[int, RankRecord]:
    """The records the ranks left in `folder`, by rank (unreadable files are skipped)."""
    records: dict[int, RankRecord] = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        parts = name.split(".")
        if len(parts) != 3 or parts[2] != "json" or not parts[0].startswith("rank"):
            continue
        try:
            rank = int(parts[0][4:])
            with open(os.path.join(folder, name)) as f:
                value = json.load(f)
        except (ValueError, OSError):
            continue
        if not isinstance(value, dict):
            continue
        record = records.setdefault(rank, RankRecord(rank))
        if parts[1] == "exit":
            record.exit = value
            record.signals = [s for s in value.get("signals", []) if isinstance(s, str)]
        elif parts[1] == "checkpoint":
            record.checkpoint = value
    return records


def _message(failure: Any) -> str:
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message or "").strip()


def _own_message(failure: Any) -> str:
    """The failure's own error text ('' when torchrun made the message up)."""
    message = _message(failure)
    return "" if any(m in message for m in _MADE_UP) else message


def _signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def root_failure(failures: dict, records: dict[int, RankRecord] | None = None) -> int | None:
    """The rank that failed first for its own reason, or None when every failure was a stop.

    A failure is *secondary* when the rank died of SIGTERM/SIGINT without an error of its own
    (torchrun stops the other ranks so after the first failure), when its error is the kind a
    rank gets because a peer vanished ("Connection closed by peer"), or when the rank had caught
    a stop signal and exited by itself (a graceful stop). Of the others, the earliest wins.

    Args:
        failures: torchrun's `{rank: ProcessFailure}`.
        records: the ranks' records (`read_records`), if any.
    Returns:
        the rank to report; when every failure is secondary, the earliest of the non-stops, or
        None when all of them were stops.
    """
    records = records or {}
    anyone_stopped = any(r.signals for r in records.values())

    def stopped(rank: int, failure: Any) -> bool:
        own = _own_message(failure)
        if failure.exitcode in (-signal.SIGTERM, -signal.SIGINT) and not own:
            return True
        record = records.get(rank)
        if record is None or record.exit is None:
            return False
        # it caught the stop itself, or a peer did and it exited with a stop's code (`fit`
        # stops every rank at the same boundary; the script's `sys.exit(result.exit_code)`)
        return bool(record.signals) or (anyone_stopped and record.exit.get("code") in _STOP_CODES)

    def secondary(rank: int, failure: Any) -> bool:
        return stopped(rank, failure) or any(s in _message(failure) for s in _SECONDARY)

    primary = [r for r, f in failures.items() if not secondary(r, f)]
    pool = primary or [r for r, f in failures.items() if not stopped(r, f)]
    if not pool:
        return None
    return min(pool, key=lambda r: (failures[r].timestamp, r))


@dataclass
class RecordedFailure:
    """A rank's failure as its exit record tells it (the fields of torchrun's ProcessFailure
    that the launcher reads)."""

    exitcode: int
    message: str
    timestamp: float


def with_recorded_errors(failures: dict | None, records: dict[int, RankRecord]) -> dict | None:
    """torchrun's `failures`, plus each rank whose exit record holds the error its script raised
    where torchrun has no error of that rank's own.

    torchrun reports the ranks that had ended when it looked, then stops the rest. On torch 2.6
    the rank that raised may still be exiting when its peer's "Connection closed by peer" ends
    that peer: it is then missing from `failures`, or reported as killed by SIGTERM.
    """
    if not failures:
        return failures
    merged = dict(failures)
    for rank, record in records.items():
        error = (record.exit or {}).get("error")
        if error and (rank not in merged or not _own_message(merged[rank])):
            merged[rank] = RecordedFailure(record.exit["code"], error, record.exit["time"])
    return merged


def _recorded_code(record: RankRecord | None) -> int:
    """The nonzero code the rank's script ended with (0: none recorded, or it succeeded)."""
    if record is None or record.exit is None:
        return 0
    code = record.exit.get("code")
    return code if isinstance(code, int) and code > 0 else 0


def failure_text(failure: Any, record: RankRecord | None = None) -> str:
    """A failure in a few words: the last line of its error, or the exit code or signal."""
    message = _own_message(failure)
    if not message:
        if _recorded_code(record):
            return f"exit code {_recorded_code(record)}"
        name = _signal_name(failure.exitcode)
        return f"killed by {name}" if name else f"exit code {failure.exitcode}"
    last = [line for line in message.splitlines() if line.strip()]
    return last[-1].strip() if last else message


def exit_code_of(failure: Any, record: RankRecord | None = None) -> int:
    """The launcher's exit code for a rank's failure: the code its script ended with when it
    recorded one (torchrun may SIGTERM a rank that is still exiting, so the signal it died of
    says nothing: a crash must never read as 143, "preempted, requeue me"); else its exit code,
    or 128 + the signal number."""
    if _recorded_code(record):
        return _recorded_code(record)
    return failure.exitcode if failure.exitcode > 0 else 128 + (-failure.exitcode or 1)


def own_codes(records: dict[int, RankRecord]) -> list[int]:
    """The nonzero codes the ranks' scripts ended with, by rank (`sys.exit(75)` after a stop)."""
    return [_recorded_code(records[r]) for r in sorted(records) if _recorded_code(records[r])]


def first_stop(records: dict[int, RankRecord]) -> float | None:
    """When the first rank was told to stop by a forwarded hangup (None: not recorded)."""
    times = [r.exit["stop_time"] for r in records.values() if r.exit and "stop_time" in r.exit]
    return min(times) if times else None


def failure_line(failures: dict, rank: int, records: dict[int, RankRecord] | None = None) -> str:
    """`functrain.launch: rank R failed (...); all ranks were stopped (also failed: ...).`"""
    others = sorted(r for r in failures if r != rank)
    also = f" (also failed: ranks {others})" if others else ""
    text = failure_text(failures[rank], (records or {}).get(rank))
    return f"functrain.launch: rank {rank} failed ({text}); all ranks were stopped{also}."


def node_ranks(records: dict[int, RankRecord], nproc: int, node_rank: int) -> list[int]:
    """The global ranks of this node's `nproc` processes: as the ranks recorded them, else
    torchrun's static assignment (`node_rank * nproc + local_rank`)."""
    by_local = {
        r.exit["local_rank"]: rank
        for rank, r in records.items()
        if r.exit is not None and isinstance(r.exit.get("local_rank"), int)
    }
    return sorted(by_local.get(local, node_rank * nproc + local) for local in range(nproc))


def stop_line(
    reason: str,
    records: dict[int, RankRecord],
    ranks: list[int],
    since: float | None,
    note: str = "",
    where: str = "",
) -> str:
    """The launcher's line after a stop (SIGTERM, Ctrl-C), from what the ranks recorded.

    Args:
        reason: what stopped the run, e.g. "SIGTERM" or "Ctrl-C (SIGINT)".
        records: the ranks' records, by global rank.
        ranks: this node's global ranks (`node_ranks`).
        since: when the stop was asked (checkpoints committed after it count as the stop's own).
        note: why ranks were killed, when they were ("a second Ctrl-C").
        where: said after "all N ranks" (" on this node" for one node of several).
    """
    nproc = len(ranks)
    killed = [r for r in ranks if records.get(r, RankRecord(r)).exit is None]
    steps = {
        r: records[r].checkpoint.get("step")
        for r in ranks
        if r in records and records[r].checkpoint is not None
    }
    times = [records[r].checkpoint.get("time", 0) for r in steps]
    who = (f"all {nproc} ranks" if nproc > 1 else "the rank") + where
    if killed:
        how = note or "they did not stop within the stop timeout"
        line = f"ranks {killed} were killed ({how})"
        if len(killed) < nproc:
            line += f"; ranks {[r for r in ranks if r not in killed]} exited"
    elif len(steps) == nproc and len(set(steps.values())) == 1:
        step = next(iter(steps.values()))
        if since is not None and all(t >= since for t in times):
            line = f"{who} checkpointed at step {step} and exited"
        else:
            line = f"{who} exited; their newest checkpoint is step {step}"
    elif steps:
        line = f"{who} exited; newest checkpoints by rank: {dict(sorted(steps.items()))}"
    else:
        line = f"{who} exited (no functrain checkpoint was written)"
    return f"functrain.launch: stopped by {reason}; {line}."


def print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
