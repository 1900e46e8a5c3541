"""One run owns a Manager root at a time: a lease in `<root>/LEASE.json`.

Two runs writing one root (started twice by mistake) would delete each other's saves in flight
and adopt each other's checkpoints. So the first run takes a lease -- a small JSON record of its
host, process id, start time and a random token -- and refreshes it in a background thread every
`ttl / 4` seconds; every commit first checks that the lease is still its own. A second run that
finds the lease held gets `CheckpointLeaseError` naming the owner.

A lease is taken over only when its owner is gone:

- on the same machine, at once when the owner process no longer exists (a SIGKILLed run that
  torchrun restarts, a crash), or when it is this very process (another `Manager` of one root);
- from a torchrun restart of the same run on any machine (same `TORCHELASTIC_RUN_ID`, higher
  `TORCHELASTIC_RESTART_COUNT`), at once;
- otherwise once it has not been refreshed for `ttl` seconds (watched with this process's own
  clock, so clock skew between machines does not matter), or its last refresh is long past.

What each storage guarantees (the create-if-absent and compare-and-swap the lease relies on):

- local files: creation is atomic everywhere (`link` refuses an existing name); a take-over or
  refresh runs under an exclusive `flock` of the root directory: atomic between processes of
  one machine and on network file systems whose locks work (NFSv4, Lustre with `flock`).
- `memory://`: atomic (one process).
- `s3://`: conditional writes (`If-None-Match: *`, `If-Match: <etag>`), requested explicitly
  (`use_conditional_write`), which AWS S3, MinIO and moto honour: atomic. Without them
  (`storage_options={"use_conditional_write": False}`, for stores that reject the headers)
  tensorstore checks with a HEAD before the PUT, which is *not* atomic: two runs starting within
  the same fraction of a second can both believe they won; the loser finds out at its next
  refresh or commit, which fails.
- `gs://`: generation preconditions: atomic.

Example:
    >>> lease = Lease(resolve("/runs/a"), ttl=30.0)
    >>> lease.acquire()      # raises CheckpointLeaseError when another live run holds it
    >>> lease.check()        # before each commit
    >>> lease.release()
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from . import layout, storage
from .errors import CheckpointLeaseError, CheckpointStorageError

logger = logging.getLogger("functrain.checkpoint")
LEASE_FORMAT = "functrain.lease"
DEFAULT_TTL = 30.0


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
            return cls(
                **{f.name: obj.get(f.name) for f in dataclasses.fields(cls) if f.name in obj}
            )
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
        pid_start=_pid_start(os.getpid()),
        boot_id=_boot_id(),
        run_id=run_id if run_id and run_id != "none" else None,
        restart=int(restart) if restart and restart.isdigit() else None,
    )


class Lease:
    """The lease of one Manager root, held by this process once `acquire` returns.

    Args:
        root: the Manager root.
        ttl: seconds without a refresh after which another run may take the lease over; it is
            refreshed every `ttl / 4` seconds while held.
    """

    def __init__(self, root: storage.Location, ttl: float = DEFAULT_TTL):
        self.root = root
        self.ttl = float(ttl)
        self.url = root.file_url(layout.LEASE_FILE)
        self._store = _LocalStore(root) if root.is_local else _ObjectStore(root)
        self._me = this_process(ttl)
        self._lock = threading.Lock()
        self._held = False
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def owner(self) -> dict:
        """This process's identity as recorded in COMMIT.json's "writer"."""
        me = self._me
        return {"host": me.host, "pid": me.pid, "lease": me.token, "run_id": me.run_id}

    def acquire(self) -> None:
        """Take the lease, waiting (up to the owner's ttl) only to tell a dead owner from a live
        one on another machine.

        Raises:
            CheckpointLeaseError: another live run holds it (the message names it).
            CheckpointStorageError: the lease could not be read or written.
        """
        watched: tuple[str, int, float] | None = None  # (token, count, since) of a remote owner
        races = 0
        while True:
            data, version = self._io(self._store.read)
            other = None if data is None else Owner.parse(data)
            if data is not None and other is None:
                logger.warning("%s is not a lease record; replacing it", self.url)
            verdict = "take" if data is None or other is None else self._verdict(other)
            if verdict == "held":
                raise self._held_error(other, "it is alive on this machine")
            if verdict == "watch":
                now = time.monotonic()
                # Any change of the record while watched (a refresh, or a new owner's token)
                # means a live run is writing it; resetting the watch instead could wait forever.
                if watched is not None and watched[:2] != (other.token, other.count):
                    raise self._held_error(other, "it refreshed the lease just now")
                if watched is None:
                    watched = (other.token, other.count, now)
                if now - watched[2] < other.ttl:
                    time.sleep(min(1.0, other.ttl / 10))
                    continue
                verdict = f"take:not refreshed for {other.ttl:g}s"
            if verdict.startswith("take"):
                me = dataclasses.replace(self._me, refreshed=time.time(), count=0)
                if self._io(self._store.swap, me.to_json(), version):
                    self._me = me
                    why = verdict.partition(":")[2]
                    if other is not None and other.token != me.token:
                        log = logger.info if why == "this process" else logger.warning
                        log(
                            "functrain.checkpoint: took over the lease of %s from %s (%s)",
                            self.root.url,
                            other.describe(),
                            why,
                        )
                    break
                races += 1  # somebody else wrote in between: look again (a few times)
                if races > 20:
                    raise CheckpointStorageError(
                        f"the lease {self.url} kept changing while this run tried to take it "
                        "(20 conditional writes failed); another run is starting on this root, "
                        "or the store does not honour conditional writes -- retry, or pass "
                        "lease_ttl=None to Manager to run without a lease"
                    )
        self._held, self._lost = True, None
        self._start_refresher()

    def _verdict(self, other: Owner) -> str:
        """ "take[:why]", "held" or "watch" (a remote owner: alive only if it refreshes)."""
        me = self._me
        if other.token == me.token or (other.host == me.host and other.pid == me.pid):
            return "take:this process"
        if (
            me.run_id is not None
            and other.run_id == me.run_id
            and other.restart is not None
            and me.restart is not None
            and me.restart > other.restart
        ):
            return "take:an earlier attempt of this torchrun run"
        if other.host == me.host:
            if other.boot_id and me.boot_id and other.boot_id != me.boot_id:
                return "take:the machine rebooted since"
            if not _alive(other.pid, other.pid_start):
                return "take:its process is gone"
            return "held"
        if time.time() - other.refreshed > max(4 * other.ttl, 120.0):
            return "take:its last refresh is long past"
        return "watch"

    def _held_error(self, other: Owner, why: str) -> CheckpointLeaseError:
        return CheckpointLeaseError(
            f"{self.root.url} is in use by another run ({other.describe()}; {why}): two runs "
            "writing one checkpoint root would delete each other's saves. Stop that run, or give "
            "this one another root (Manager(root=...)). If that run is dead on another machine, "
            f"its lease ({self.url}) expires {other.ttl:g}s after its last refresh and the next "
            "start takes it over"
        )

    def check(self) -> None:
        """Raise unless this process still holds the lease (refreshing it on the way).

        Raises:
            CheckpointLeaseError: the lease was taken over (or released).
        """
        if not self._held:
            raise CheckpointLeaseError(f"this run does not hold the lease of {self.root.url}")
        if not self.refresh():
            raise CheckpointLeaseError(
                f"this run lost the lease of {self.root.url}: {self._lost}. Another run now "
                "owns the root, so this one must not commit there; stop it (and check why two "
                "runs used one root)"
            )

    def refresh(self) -> bool:
        """Refresh the lease; False once it is lost (taken over by another owner)."""
        with self._lock:
            if self._lost is not None:
                return False
            for _ in range(3):
                data, version = self._io(self._store.read)
                current = None if data is None else Owner.parse(data)
                if current is None or current.token != self._me.token:
                    self._lost = (
                        "its lease record was deleted"
                        if current is None
                        else f"it was taken over by {current.describe()}"
                    )
                    return False
                me = dataclasses.replace(self._me, refreshed=time.time(), count=current.count + 1)
                if self._io(self._store.swap, me.to_json(), version):
                    self._me = me
                    return True
            return True  # contended but still ours: the next refresh settles it

    def release(self) -> None:
        """Stop refreshing and delete the lease record if it is still this process's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if not self._held:
            return
        self._held = False
        try:
            data, version = self._store.read()
            current = None if data is None else Owner.parse(data)
            if current is not None and current.token == self._me.token:
                self._store.swap(None, version)
        except Exception as err:  # noqa: BLE001 -- releasing is best effort (it expires anyway)
            logger.warning("could not release the lease %s: %s", self.url, err)

    def _start_refresher(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def run():
            while not self._stop.wait(self.ttl / 4):
                try:
                    if not self.refresh():
                        logger.error(
                            "functrain.checkpoint: this run lost the lease of %s (%s); its next "
                            "save will fail",
                            self.root.url,
                            self._lost,
                        )
                        return
                except Exception as err:  # noqa: BLE001 -- retried at the next interval
                    logger.warning("refreshing the lease %s failed: %s", self.url, err)

        self._thread = threading.Thread(target=run, name="functrain-lease", daemon=True)
        self._thread.start()

    def _io(self, fn, *args):
        try:
            return fn(*args)
        except CheckpointLeaseError:
            raise
        except Exception as err:
            raise CheckpointStorageError(
                f"cannot read or write the lease {self.url}: {err}. The root must be writable "
                "by the run that owns it (pass lease_ttl=None to Manager for a root this run "
                "only reads)"
            ) from err


class _LocalStore:
    """LEASE.json on a local (or mounted) file system.

    Creating it is atomic on its own (`link` fails when the name exists); replacing or deleting
    it happens under an exclusive `flock` of the root directory, so that reading, comparing and
    swapping is one step for every process of the machine (and on network file systems whose
    locks work). No lock file is left behind.
    """

    def __init__(self, root: storage.Location):
        self.dir = root.local_path
        self.path = os.path.join(self.dir, layout.LEASE_FILE)

    def read(self) -> tuple[bytes | None, Any]:
        try:
            with open(self.path, "rb") as f:
                data = f.read(1 << 16)
        except FileNotFoundError:
            return None, None
        return data, data

    def swap(self, data: bytes | None, expected: Any) -> bool:
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # no locks here: creation stays atomic, a take-over is best effort
                pass
            current, _ = self.read()
            if current != expected:
                return False
            if data is None:
                os.remove(self.path)
                return True
            tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.partial"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                if expected is None:
                    try:
                        os.link(tmp, self.path)  # fails if another run created it meanwhile
                    except FileExistsError:
                        return False
                else:
                    os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            storage.fsync_dir(self.dir)
            return True
        finally:
            os.close(fd)  # releases the flock


class _ObjectStore:
    """LEASE.json as an object, swapped with tensorstore's conditional writes."""

    def __init__(self, root: storage.Location):
        kvstore = dict(root.kvstore)
        if root.scheme == "s3":
            kvstore.setdefault("use_conditional_write", True)
        self.loc = dataclasses.replace(root, kvstore=kvstore)

    def read(self) -> tuple[bytes | None, bytes]:
        return storage.read_versioned(self.loc, layout.LEASE_FILE)

    def swap(self, data: bytes | None, expected: bytes) -> bool:
        return storage.write_if(self.loc, layout.LEASE_FILE, data, expected) is not None


def _proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # fields from the state on


def _pid_start(pid: int) -> int | None:
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _alive(pid: int, start: int | None) -> bool:
    """True when process `pid` of this machine exists and is the one that took the lease."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by another user
    except OSError:
        return False
    fields = _proc_stat(pid)
    if fields:
        if fields[0] in ("Z", "X"):  # a zombie: killed, not yet reaped
            return False
        if start is not None and _pid_start(pid) not in (None, start):
            return False  # the pid was reused by another process
    return True
