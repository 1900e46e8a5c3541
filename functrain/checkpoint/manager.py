"""`Manager`: periodic, asynchronous, atomic checkpoints of a run, with retention and auto-resume.

A run's checkpoints live under one root, one directory per optimizer step (see `retention`):

    <root>/step_000000100/      committed (renamed into place, or marked by COMMIT.json)
    <root>/step_000000200.tmp/  a save in flight, or one a crash interrupted (cleaned up later)
    <root>/LEASE.json           the run that owns the root (see `lease`)

`should_save(timestamp)` says when the interval is due; `save(state)` blocks only while the state
is copied off the device, then writes in a background thread (a second save first waits for the
first, and an error of the thread is raised by the next call). After each commit, checkpoints
beyond the last `keep_last` (and not on the `keep_every` period) are deleted, never the newest
and never before the new one is committed. `restore(like)` loads the newest committed checkpoint
that verifies -- a damaged newer one is set aside as `step_N.corrupt-<reason>` (never deleted) --
or, on a fresh run, the weights of `init_from` (a fine-tune from another run).

The first `save` or `restore` takes the root's lease: a second run on the same root gets a
`CheckpointLeaseError` naming the owner instead of deleting the first run's saves.

Example:
    >>> manager = Manager("s3://bucket/run", every="1ep", keep_last=3,
    ...                   storage_options={"endpoint": "http://127.0.0.1:9000"})
    >>> state = manager.restore(like=state) or state
    >>> if manager.should_save(state.timestamp):
    ...     manager.save(state)
    >>> manager.close()
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import numbers
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..launch import status as launch_status
from ..parallel import teardown
from ..units import Time, Timestamp, TimeUnit
from . import layout, reader, retention, storage, writer
from .errors import CheckpointCorruptError, CheckpointError, CheckpointLeaseError
from .lease import DEFAULT_TTL, Lease
from .retention import committed_steps, retained_steps

logger = logging.getLogger("functrain.checkpoint")
STEP_DIR = layout.STEP_DIR
step_dir_name = layout.step_dir_name
_COUNT_FIELDS = {
    TimeUnit.EPOCH: "epoch",
    TimeUnit.BATCH: "batch",
    TimeUnit.SAMPLE: "sample",
    TimeUnit.TOKEN: "token",
}
# What each rank reports after trying a checkpoint: 0 loaded, 1.. a kind of damage, then any
# other failure (which stops the restore on every rank: it is not the checkpoint's fault).
_OTHER_FAILURE = len(layout.SET_ASIDE_REASONS) + 1


def checkpoints(root: Any, storage_options: dict | None = None) -> list[tuple[int, str]]:
    """The committed checkpoints under `root` as `[(step, url), ...]`, oldest first."""
    loc = storage.resolve(root, storage_options)
    return [(step, child.url) for step, child in committed_steps(loc)]


def latest(root: Any, storage_options: dict | None = None) -> str | None:
    """The URL of the newest committed checkpoint under `root`, or None.

    Example:
        >>> state = functrain.checkpoint.load(latest("/runs/a"), like=state)
    """
    found = checkpoints(root, storage_options)
    return found[-1][1] if found else None


class Manager:
    """Saves a run's checkpoints under `root` and restores the newest one that verifies.

    Every rank calls every method together (saves and restores are collective).

    Args:
        root: the run's checkpoint directory: a path, `file://`, `memory://`, `s3://` or `gs://`.
        every: the save interval for `should_save` ("1ep", "500ba", "0.1dur", "30m", a `Time`,
            an int of batches), or None to save only when asked.
        keep_last: how many of the newest checkpoints to keep (None: all).
        keep_every: also keep every checkpoint whose step is a multiple of this int, or whose
            timestamp is a multiple of this `Time` ("10ep", "5000ba"); None: no such rule.
        async_save: write in a background thread; `save` blocks only for the copy off the device.
        storage_options: backend options for `root` (S3 `endpoint`, `region`, ...).
        init_from: a checkpoint (path, URL or `storage.Location`) that `restore` loads when
            `root` holds none: the start of a fine-tune from another run.
        init_weights_only: load only params/buffers from `init_from`.
        init_ignore: glob patterns of keys not to load from `init_from` ("params.head.*").
        process_group: the ranks that save together (default: all; asynchronous saves get their
            own gloo group so that the background thread never collides with training
            collectives).
        fallback: when the newest checkpoint is damaged (`CheckpointCorruptError`), `restore`
            logs which and why, renames it `step_N.corrupt-<reason>` and restores the newest
            older one that verifies. False: `restore` raises instead (and touches nothing).
        lease_ttl: seconds after which a dead owner's lease of `root` may be taken over (it is
            refreshed every `lease_ttl / 4` s); None: take no lease (a root only read, or
            shared on purpose -- then nothing stops two runs from colliding).
    Example:
        >>> manager = Manager("/runs/a", every="100ba", keep_last=3, keep_every=1000)
        >>> functrain.fit(step, state, data, duration="10ep", checkpoints=manager, autoresume=True)
    """

    def __init__(
        self,
        root: Any,
        every: Any = "1ep",
        keep_last: int | None = 3,
        keep_every: int | str | Time | None = None,
        async_save: bool = True,
        *,
        storage_options: dict | None = None,
        init_from: Any = None,
        init_weights_only: bool = True,
        init_ignore: Sequence[str] = (),
        process_group=None,
        fallback: bool = True,
        lease_ttl: float | None = DEFAULT_TTL,
    ):
        self.root = storage.resolve(root, storage_options)
        self.storage_options = storage_options
        self.every = _every(every)
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise ValueError(
                f"keep_last must be a positive int or None (keep all), got {keep_last!r}"
            )
        for name, flag in (
            ("async_save", async_save),
            ("init_weights_only", init_weights_only),
            ("fallback", fallback),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if isinstance(init_ignore, str):
            raise TypeError(f"init_ignore must be a list of globs, got the string {init_ignore!r}")
        if lease_ttl is not None and not (
            isinstance(lease_ttl, numbers.Real)
            and not isinstance(lease_ttl, bool)
            and math.isfinite(lease_ttl)
            and lease_ttl > 0
        ):
            raise ValueError(
                f"lease_ttl must be a positive number of seconds or None, got {lease_ttl!r}"
            )
        self.keep_last = keep_last
        self.keep_every = _keep_every(keep_every)
        self.async_save = async_save
        self.init_from = init_from
        self.init_weights_only = init_weights_only
        self.init_ignore = tuple(init_ignore)
        self.fallback = fallback
        self.restored_from: str | None = None  # the checkpoint the last `restore` loaded
        self._group, self._own_group = process_group, False
        rank, world = writer.dist_info(process_group)
        self._rank = rank
        if self.async_save and process_group is None and world > 1:
            self._group = torch.distributed.new_group(backend="gloo")
            self._own_group = True
        self._executor = None
        if self.async_save:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="functrain-checkpoint"
            )
        self._pending: tuple[concurrent.futures.Future, str, int] | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # host copies, reused save after save
        self._last_index: int | None = None
        self._collected = False  # stale directories of interrupted saves removed
        self._closed = False
        self._known: set[int] = set()  # steps this manager wrote or restored
        # Only rank 0 holds the lease; the others learn the outcome from it.
        self._lease = Lease(self.root, lease_ttl) if lease_ttl is not None and rank == 0 else None
        self._leased = lease_ttl is None
        if self._lease is not None:  # released when the manager goes away, or at exit
            self._release = weakref.finalize(self, self._lease.release)
        if self._own_group:
            # Closed by functrain's teardown (held weakly) before the process groups are
            # destroyed: the save in flight needs its group, and a group still referenced is
            # never freed (its gloo threads would live into interpreter exit).
            teardown.on_exit(self.close)

    # -- when to save -------------------------------------------------------------------------

    def should_save(self, timestamp: Timestamp) -> bool:
        """True when the run has crossed the next multiple of `every` since the last check.

        A timestamp exactly on a multiple counts as crossing it on the first check (so the
        first "1ep" save happens when epoch 1 is reached); a restored run's position does not.
        """
        if self.every is None:
            return False
        count, period = self._progress(timestamp)
        if count <= 0 or period <= 0:
            return False
        ratio = count / period
        index = math.floor(ratio + 1e-9)
        if self._last_index is None:
            on_boundary = abs(ratio - round(ratio)) < 1e-9
            self._last_index = index - 1 if on_boundary else index
        due = index > self._last_index
        self._last_index = max(index, self._last_index)
        return due

    def _progress(self, timestamp: Timestamp) -> tuple[float, float]:
        every = self.every
        if every.unit is TimeUnit.DURATION:
            return timestamp.batch, timestamp.to_batches(every)
        return timestamp.get(every.unit), every.value

    # -- saving -------------------------------------------------------------------------------

    def save(self, state: Any, force: bool = False) -> str:
        """Save `state` as the checkpoint of step `state.step` (asynchronously by default).

        The caller decides when (usually with `should_save`). A committed checkpoint of the same
        step that this manager wrote or restored is kept and its URL returned, unless
        `force=True`, which rewrites it; one it did not (another run's) is an error.

        Args:
            state: the `TrainState` (any pytree with an int `step`).
            force: rewrite an existing checkpoint of the same step.
        Returns:
            the checkpoint's URL (committed once `wait()` returns, for asynchronous saves).
        Raises:
            CheckpointLeaseError: another run owns the root.
            CheckpointError: the root already holds another run's checkpoint of this step.
        """
        self._check_open()
        self.wait()
        step = getattr(state, "step", None)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise TypeError(
                f"Manager.save needs a state with a non-negative int `step`, got "
                f"{type(state).__name__} with step {step!r}"
            )
        self._take_lease()
        loc = self.root.child(step_dir_name(step))
        if not force and writer.committed(loc):
            if step in self._known:
                return loc.url
            raise CheckpointError(
                f"{loc.url} already holds a checkpoint of step {step} that this run neither "
                f"wrote nor resumed from ({_written_by(loc)}). Resume it (fit(autoresume=True) "
                "or Manager.restore), save with force=True to replace it, or give this run "
                "another root"
            )
        buffers = self._buffers if self.async_save else None
        staged = writer.stage(state, copy=self.async_save, buffers=buffers, group=self._group)
        job = functools.partial(self._write, staged, loc, force, step)
        if self._executor is not None:
            self._pending = (self._executor.submit(job), loc.url, step)
        else:
            job()
        return loc.url

    def _write(self, staged: writer.Staged, loc: storage.Location, overwrite: bool, step: int):
        lease = self._lease
        writer.write(
            staged,
            loc,
            group=self._group,
            overwrite=overwrite,
            before_write=self._collect_garbage,
            before_commit=None if lease is None else lease.check,
            owner=None if lease is None else lease.owner,
        )
        self._known.add(step)
        if staged.rank == 0:
            self._apply_retention()
        launch_status.record_checkpoint(staged.step, loc.url)  # for the launcher's last line

    def wait(self) -> None:
        """Block until the asynchronous save in flight (if any) is committed.

        Raises:
            CheckpointError: when that save failed (the error of the background thread).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, url, step = pending
        try:
            future.result()
        except Exception as err:
            raise CheckpointError(
                f"the asynchronous save of step {step} to {url} failed: {err}"
            ) from err

    def _take_lease(self) -> None:
        """Take the root's lease on rank 0 (once); every rank raises if it could not."""
        if self._leased:
            return
        error = None
        if self._lease is not None:
            try:
                self._lease.acquire()
            except CheckpointError as err:
                error = err
        text = writer.share_text(None if error is None else str(error), self._group)
        if text is not None:
            if error is not None:
                raise error
            raise CheckpointLeaseError(f"rank 0 could not take the lease: {text}")
        self._leased = True

    def _collect_garbage(self) -> None:
        """Delete what interrupted saves and deletions left behind (rank 0, once per manager:
        leftovers come from earlier processes; on object stores it lists the whole root)."""
        if not self._collected:
            self._collected = True
            retention.collect_garbage(self.root)

    def _apply_retention(self) -> None:
        found = committed_steps(self.root)
        counts, period = None, self.keep_every
        if isinstance(period, Time):
            field = _COUNT_FIELDS[period.unit]
            counts = {step: retention.commit_count(loc, field) for step, loc in found}
            period = period.value
        keep = retained_steps(
            [s for s, _ in found], keep_last=self.keep_last, keep_every=period, counts=counts
        )
        for step, loc in found:
            if step not in keep:
                retention.delete_checkpoint(loc)

    def _housekeeping(self) -> None:
        """Clean-up and retention outside a save (a resumed run may never save again)."""
        error = None
        if self._rank == 0 and self._leased:
            try:
                self._collect_garbage()
                self._apply_retention()
            except Exception as err:  # noqa: BLE001 -- re-raised once every rank knows
                error = err
        if not writer.agree(error is None, self._group):
            if error is not None:
                raise error
            raise CheckpointError(f"rank 0 failed cleaning up {self.root.url}; see its error")

    # -- finding and restoring ------------------------------------------------------------------

    def checkpoints(self) -> list[tuple[int, str]]:
        """The committed checkpoints as `[(step, url), ...]`, oldest first."""
        return [(step, loc.url) for step, loc in committed_steps(self.root)]

    def latest(self) -> str | None:
        """The URL of the newest committed checkpoint, or None (saves in flight are not counted)."""
        found = committed_steps(self.root)
        return found[-1][1].url if found else None

    def restore(
        self,
        like: Any,
        weights_only: bool = False,
        ignore: Sequence[str] = (),
        *,
        strict: bool = True,
        inplace: bool = False,
    ) -> Any:
        """Load the newest committed checkpoint that verifies into `like`'s structure.

        A damaged newer one is set aside (see `fallback`); every rank resumes from the same
        checkpoint. Falls back to `init_from` (weights only, by default) when `root` holds
        none. Cleans up what interrupted saves left and applies retention.

        Args:
            like: the freshly initialised state (or its abstract shape).
            weights_only: load only params and buffers.
            ignore: glob patterns of keys that keep `like`'s values.
            strict: see `functrain.checkpoint.load`.
            inplace: copy into `like`'s tensors instead of returning new ones.
        Returns:
            the restored state, or None when there is nothing to restore.
        Raises:
            CheckpointLeaseError: another run owns the root.
            CheckpointCorruptError: the newest checkpoint is damaged and `fallback` is False.
        """
        self._check_open()
        self.wait()
        self._take_lease()
        options = dict(strict=strict, ignore=ignore, weights_only=weights_only, inplace=inplace)
        state = self._restore_newest(like, options)
        self._housekeeping()
        if state is None:
            if self.init_from is None:
                return None
            return reader.load(
                self.init_from,
                like,
                weights_only=self.init_weights_only,
                ignore=self.init_ignore,
                strict=strict,
                inplace=inplace,
            )
        timestamp = getattr(state, "timestamp", None)
        if self.every is not None and isinstance(timestamp, Timestamp):
            count, period = self._progress(timestamp)
            self._last_index = math.floor(count / period + 1e-9) if period > 0 else None
        return state

    def _restore_newest(self, like: Any, options: dict) -> Any:
        """Try the committed checkpoints newest first (rank 0 chooses, every rank loads)."""
        tried: set[int] = set()
        self.restored_from = None
        while True:
            newest = None
            if self._rank == 0:
                found = [s for s, _ in committed_steps(self.root) if s not in tried]
                newest = str(found[-1]) if found else None
            chosen = writer.share_text(newest, self._group)
            if chosen is None:
                return None
            step = int(chosen)
            tried.add(step)
            loc = self.root.child(step_dir_name(step))
            error, code = None, 0
            try:
                state = reader.load(loc, like, **options)
            except Exception as err:  # noqa: BLE001 -- classified, then shared with every rank
                error = err
                code = _OTHER_FAILURE
                if isinstance(err, CheckpointCorruptError):
                    reasons = layout.SET_ASIDE_REASONS
                    code = 1 + (reasons.index(err.reason) if err.reason in reasons else 0)
            worst = writer.max_over_ranks(code, self._group)
            if worst == 0:
                self._known.add(step)
                self.restored_from = loc.url
                return state
            if worst == _OTHER_FAILURE:
                if error is not None and not isinstance(error, CheckpointCorruptError):
                    raise error
                raise CheckpointError(f"another rank failed restoring {loc.url}; see its error")
            reason = layout.SET_ASIDE_REASONS[worst - 1]
            if not self.fallback:
                found = str(error) if error is not None else f"another rank found {reason} damage"
                raise CheckpointCorruptError(
                    f"{found}\nThe newest checkpoint {loc.url} is damaged; this Manager has "
                    "fallback=False. To resume from the previous one, move it aside (e.g. rename "
                    f"it to {loc.name}.corrupt-manual), or use Manager(fallback=True), which "
                    "does that",
                    reason=reason,
                ) from error
            self._set_aside(loc, reason, error)

    def _set_aside(self, loc: storage.Location, reason: str, error: Exception | None) -> None:
        failure = None
        if self._rank == 0:
            why = str(error).splitlines()[0][:300] if error is not None else "on another rank"
            try:
                name = retention.set_aside(loc, reason)
                done = f"set aside as {name}"
            except Exception as err:  # noqa: BLE001 -- resume anyway; say it could not be moved
                failure, done = err, f"could not be set aside ({err})"
            logger.warning(
                "functrain.checkpoint: checkpoint %s is damaged (%s: %s); %s; resuming from the "
                "newest older checkpoint that verifies",
                loc.url,
                reason,
                why,
                done,
            )
        writer.agree(failure is None, self._group)  # every rank sees the rename before listing

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for the save in flight, apply retention, release the lease, the thread and the
        process group."""
        if self._closed:
            return
        try:
            self.wait()
            if self._rank == 0 and self._leased and self._lease is not None:
                try:
                    self._lease.check()
                    self._apply_retention()
                except CheckpointLeaseError:
                    pass  # another manager took the root over: leave its checkpoints alone
        finally:
            self._closed = True
            if self._lease is not None:
                self._release()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            if self._own_group and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group(self._group)
            if self._own_group:
                self._group = None  # a group still referenced is never freed (its threads live)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this Manager of {self.root.url} is closed; create a new one")

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Manager({self.root.url!r}, every={self.every}, keep_last={self.keep_last}, "
            f"keep_every={self.keep_every}, async_save={self.async_save})"
        )


def _every(value: Any) -> Time | None:
    """`every` as a `Time`, refusing intervals that would never (or always) save."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"every must be a Time, a string such as '1ep' or an int, got {value!r}")
    every = Time.coerce(value)
    if not (math.isfinite(every.value) and every.value > 0):
        raise ValueError(
            f"every={value!r} would never save: give a positive interval such as '1ep', "
            "'500ba' or '0.1dur', or every=None to save only when Manager.save is called"
        )
    if every.unit is TimeUnit.DURATION and every.value > 1:
        raise ValueError(
            f"every={value!r} is longer than the run (a fraction of it is at most 1dur); "
            "use e.g. '0.25dur', or every=None"
        )
    return every


def _keep_every(value) -> int | Time | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"keep_every must be >= 1, got {value}")
        return value
    if isinstance(value, bool):
        raise TypeError(f"keep_every must be an int, a Time or None, got {value!r}")
    value = Time.coerce(value)
    if value.unit not in _COUNT_FIELDS or not (math.isfinite(value.value) and value.value > 0):
        raise ValueError(
            f"keep_every={value} cannot be checked against a checkpoint; use an int of steps "
            "or a positive Time in ep, ba, sp or tok units"
        )
    return value


def _written_by(loc: storage.Location) -> str:
    """Who wrote a checkpoint, from its COMMIT.json (best effort, for messages)."""
    try:
        commit = layout.parse_json(storage.read_bytes(loc, layout.COMMIT_FILE) or b"{}", "", "")
        who = commit.get("writer") or {}
        return f"written {commit.get('time', 'at an unknown time')} by host {who.get('host')!r}, pid {who.get('pid')!r}"
    except Exception:  # noqa: BLE001
        return "written by an unknown run"


__all__ = ["Manager", "checkpoints", "latest", "retained_steps", "step_dir_name"]
