"""Who holds a root's lease: the `Owner` record in LEASE.json, and whether that process lives.

An owner names its host, process id (with the process's start time, against pid reuse), the
machine's boot, torchrun's run id and restart count, and a random token; `alive` answers for a
process of this machine.

Example:
    >>> me = this_process(ttl=30.0)
    >>> Owner.parse(me.to_json()) == me
    True
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import time
from typing import Any

LEASE_FORMAT = "functrain.lease"


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who holds (or wants) a lease: the content of LEASE.json."""

    token: str
    host: str
    pid: int
    started: float  # wall-clock time the lease was first taken
    refreshed: float  # wall-clock time of the last refresh
    ttl: float
    count: int = 0  # refreshes so far: a change shows the owner is alive
    pid_start: int | None = None  # the process's start (clock ticks since boot), against pid reuse
    boot_id: str | None = None  # the machine's boot: another one means the owner is gone
    run_id: str | None = None  # torchrun's run id (restarts of one run share it)
    restart: int | None = None  # torchrun's restart count

    def to_json(self) -> bytes:
        return json.dumps({"format": LEASE_FORMAT, **dataclasses.asdict(self)}).encode()

    @classmethod
    def parse(cls, data: bytes) -> Owner | None:
        """The owner recorded in `data`, or None when it is not a lease record."""
        try:
            obj = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or obj.pop("format", None) != LEASE_FORMAT:
            return None
        types = {"token": str, "host": str, "pid": int, "started": float, "refreshed": float}
        types.update(ttl=float, count=int)
        for name, kind in types.items():
            value = obj.get(name)
            if not isinstance(value, (int, float) if kind is float else kind) or isinstance(
                value, bool
            ):
                return None
        try:
            fields: dict[str, Any] = {
                f.name: obj.get(f.name) for f in dataclasses.fields(cls) if f.name in obj
            }
            return cls(**fields)
        except TypeError:
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        text = f"host {self.host}, pid {self.pid}, running since {when}"
        if self.run_id:
            text += f" (torchrun run {self.run_id}, restart {self.restart})"
        return text


def this_process(ttl: float, token: str | None = None) -> Owner:
    """An `Owner` record for the calling process."""
    now = time.time()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return Owner(
        token=token or secrets.token_hex(8),
        host=socket.gethostname(),
        pid=os.getpid(),
        started=now,
        refreshed=now,
        ttl=float(ttl),
        pid_start=pid_start(os.getpid()),
        boot_id=boot_id(),
        run_id=run_id if run_id and run_id != "none" else None,
        restart=int(restart) if restart and restart.isdigit() else None,
    )


def proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # fields from the state on


def pid_start(pid: int) -> int | None:
    fields = proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def alive(pid: int, start: int | None) -> bool:
    """True when process `pid` of this machine exists and is the one that took the lease."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by another user
    except OSError:
        return False
    fields = proc_stat(pid)
    if fields:
        if fields[0] in ("Z", "X"):  # a zombie: killed, not yet reaped
            return False
        if start is not None and pid_start(pid) not in (None, start):
            return False  # the pid was reused by another process
    return True


__all__ = ["LEASE_FORMAT", "Owner", "alive", "boot_id", "pid_start", "proc_stat", "this_process"]
