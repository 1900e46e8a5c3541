"""One run owns a Manager root at a time: a lease in `<root>/LEASE.json`.

Two runs writing one root (started twice by mistake) would delete each other's saves in flight
and adopt each other's checkpoints. So the first run takes a lease -- a small JSON record of its
host, process id, start time and a random token -- and refreshes it in a background thread every
`ttl / 4` seconds; every commit first checks that the lease is still its own. A second run that
finds the lease held gets `CheckpointLeaseError` naming the owner.

A lease is taken over only when its owner is gone:

- on the same machine, at once when the owner process no longer exists (a SIGKILLed run that
  torchrun restarts, a crash), or when it is this very process (another `Manager` of one root);
  a live owner there is waited for up to `LIVE_OWNER_WAIT_S` (the ranks of a launcher killed a
  moment ago are still exiting), then refused;
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
import logging
import math
import numbers
import threading
import time
from typing import Any

from . import layout, storage
from .errors import CheckpointLeaseError, CheckpointStorageError
from .lease_owner import Owner, alive, this_process
from .lease_store import LocalStore, ObjectStore

logger = logging.getLogger("functrain.checkpoint")
DEFAULT_TTL = 30.0
# The longest ttl a record is trusted with: a record is untrusted input, and one that says 1e9 or
# Infinity (another host's, or a crafted one) must not make the next run wait forever.
MAX_TTL = 3600.0
WAIT_REPORT_S = 30.0  # while waiting out a silent owner, say so this often
# A live owner on this machine may be on its way out: the ranks of a launcher that was just
# killed die with it, within moments. A restart right then waits this long for it to exit
# before refusing (a second run started by mistake is refused after the wait).
LIVE_OWNER_WAIT_S = 10.0


def check_ttl(ttl: Any) -> None:
    """Refuse a lease ttl that is not a positive number of seconds up to `MAX_TTL` (or None)."""
    if ttl is not None and not (
        isinstance(ttl, numbers.Real)
        and not isinstance(ttl, bool)
        and math.isfinite(ttl)
        and 0 < ttl <= MAX_TTL
    ):
        raise ValueError(
            f"lease_ttl must be a positive number of seconds up to {MAX_TTL:g} (what another "
            f"run waits out at most) or None, got {ttl!r}"
        )


def bounded_ttl(ttl: float) -> float:
    """A record's ttl as this process waits it out: at most `MAX_TTL` (also for NaN, infinity
    or a non-positive value)."""
    return min(ttl, MAX_TTL) if math.isfinite(ttl) and ttl > 0 else MAX_TTL


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
        self._store = LocalStore(root) if root.is_local else ObjectStore(root)
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
        one on another machine, and (up to `LIVE_OWNER_WAIT_S`) for a live owner on this machine
        to exit.

        Raises:
            CheckpointLeaseError: another live run holds it (the message names it).
            CheckpointStorageError: the lease could not be read or written.
        """
        watched: tuple[str, int, float] | None = None  # (token, count, since) of a remote owner
        live_since: float | None = None  # when a live owner on this machine was first seen
        told = -math.inf  # when the wait was last reported
        races = 0
        while True:
            data, version = self._io(self._store.read)
            other = None if data is None else Owner.parse(data)
            if data is not None and other is None:
                logger.warning("%s is not a lease record; replacing it", self.url)
            verdict = "take" if data is None or other is None else self._verdict(other)
            if verdict == "held":
                now = time.monotonic()
                live_since = now if live_since is None else live_since
                if now - live_since < LIVE_OWNER_WAIT_S:
                    if live_since == now:
                        logger.warning(
                            "functrain.checkpoint: %s is held by %s, alive on this machine; "
                            "waiting up to %gs for it to exit",
                            self.root.url,
                            other.describe(),
                            LIVE_OWNER_WAIT_S,
                        )
                    time.sleep(0.2)  # a dying owner (its launcher was killed) exits meanwhile
                    continue
                why = f"it is alive on this machine, and did not exit in {LIVE_OWNER_WAIT_S:g}s"
                raise self._held_error(other, why)
            if verdict == "watch":
                now = time.monotonic()
                # Any change of the record while watched (a refresh, or a new owner's token)
                # means a live run is writing it; resetting the watch instead could wait forever.
                if watched is not None and watched[:2] != (other.token, other.count):
                    raise self._held_error(other, "it refreshed the lease just now")
                if watched is None:
                    watched = (other.token, other.count, now)
                ttl = bounded_ttl(other.ttl)
                if now - watched[2] < ttl:
                    if now - told >= WAIT_REPORT_S:
                        told = now
                        self._report_wait(other, ttl - (now - watched[2]))
                    time.sleep(min(1.0, ttl / 10))
                    continue
                verdict = f"take:not refreshed for {ttl:g}s"
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
            if not alive(other.pid, other.pid_start):
                return "take:its process is gone"
            return "held"
        if time.time() - other.refreshed > max(4 * bounded_ttl(other.ttl), 120.0):
            return "take:its last refresh is long past"
        return "watch"

    def _report_wait(self, other: Owner, left: float) -> None:
        logger.warning(
            "functrain.checkpoint: waiting for the lease of %s, held by %s on another machine: "
            "it is taken over once unchanged for %gs (%.0fs more). If that run is dead, delete "
            "%s to take the root over now; if it is alive, stop it or give this run another root",
            self.root.url,
            other.describe(),
            bounded_ttl(other.ttl),
            left,
            self.url,
        )

    def _held_error(self, other: Owner, why: str) -> CheckpointLeaseError:
        return CheckpointLeaseError(
            f"{self.root.url} is in use by another run ({other.describe()}; {why}): two runs "
            "writing one checkpoint root would delete each other's saves. Stop that run, or give "
            "this one another root (Manager(root=...)). If that run is dead on another machine, "
            f"its lease ({self.url}) expires {bounded_ttl(other.ttl):g}s after its last refresh and "
            "the next start takes it over"
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
