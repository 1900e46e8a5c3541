"""`Manager`: periodic, asynchronous, atomic checkpoints of a run, with retention and auto-resume.

A run's checkpoints live under one root, one directory per optimizer step:

    <root>/step_000000100/      committed (renamed into place, or marked by COMMIT.json)
    <root>/step_000000200.tmp/  a save in flight, or one a crash interrupted (cleaned up later)

`should_save(timestamp)` says when the interval is due; `save(state)` blocks only while the state
is copied off the device, then writes in a background thread (a second save first waits for the
first, and an error of the thread is raised by the next call). After each commit, checkpoints
beyond the last `keep_last` (and not on the `keep_every` period) are deleted, never the newest
and never before the new one is committed. `restore(like)` picks the newest committed checkpoint
-- or, on a fresh run, the weights of `init_from` (a fine-tune from another run).

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
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .. import launch_status, teardown
from ..time import Time, Timestamp, TimeUnit
from . import layout, reader, storage, writer
from .errors import CheckpointError

STEP_DIR = re.compile(r"^step_(\d+)$")
_STALE = re.compile(r"^step_\d+\.(tmp|old|deleting)$")
_COMMIT_KEY = re.compile(r"^(step_\d+)/" + re.escape(layout.COMMIT_FILE) + r"$")
_COUNT_FIELDS = {
    TimeUnit.EPOCH: "epoch",
    TimeUnit.BATCH: "batch",
    TimeUnit.SAMPLE: "sample",
    TimeUnit.TOKEN: "token",
}


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint of optimizer step `step`."""
    return f"step_{int(step):09d}"


def checkpoints(root: Any, storage_options: dict | None = None) -> list[tuple[int, str]]:
    """The committed checkpoints under `root` as `[(step, url), ...]`, oldest first."""
    loc = storage.resolve(root, storage_options)
    return [(step, child.url) for step, child in _committed(loc)]


def latest(root: Any, storage_options: dict | None = None) -> str | None:
    """The URL of the newest committed checkpoint under `root`, or None.

    Example:
        >>> state = functrain.checkpoint.load(latest("/runs/a"), like=state)
    """
    found = checkpoints(root, storage_options)
    return found[-1][1] if found else None


def _committed(root: storage.Location) -> list[tuple[int, storage.Location]]:
    if root.is_local:
        steps = [
            (int(m.group(1)), root.child(name))
            for name in storage.list_dirs(root)
            if (m := STEP_DIR.match(name))
        ]
        found = [(s, loc) for s, loc in steps if writer.committed(loc)]
    else:  # one listing instead of one request per directory
        found = [
            (int(m.group(1)[5:]), root.child(m.group(1)))
            for key in storage.list_keys(root)
            if (m := _COMMIT_KEY.match(key))
        ]
    return sorted(found, key=lambda item: item[0])


def retained_steps(
    steps: Iterable[int],
    *,
    keep_last: int | None,
    keep_every: float | None = None,
    counts: Mapping[int, float] | None = None,
) -> set[int]:
    """The checkpoints retention keeps.

    Args:
        steps: the steps of the committed checkpoints.
        keep_last: keep this many newest (None: keep all).
        keep_every: also keep those whose count is a multiple of it (None: no such rule).
        counts: each step's count in `keep_every`'s unit (default: the step itself).
    Returns:
        the kept steps; always includes the newest.
    Example:
        >>> sorted(retained_steps([10, 20, 30, 40, 50], keep_last=2, keep_every=20))
        [20, 40, 50]
    """
    ordered = sorted(set(steps))
    if not ordered:
        return set()
    keep = set(ordered if keep_last is None else ordered[-keep_last:])
    keep.add(ordered[-1])
    if keep_every:
        for step in ordered:
            count = step if counts is None else counts.get(step)
            if count is not None and math.isclose(count % keep_every, 0, abs_tol=1e-9):
                keep.add(step)
    return keep


class Manager:
    """Saves a run's checkpoints under `root` and restores the newest one.

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
    ):
        self.root = storage.resolve(root, storage_options)
        self.storage_options = storage_options
        self.every = None if every is None else Time.coerce(every)
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(
                f"keep_last must be a positive int or None (keep all), got {keep_last!r}"
            )
        self.keep_last = keep_last
        self.keep_every = self._keep_every(keep_every)
        self.async_save = bool(async_save)
        self.init_from = init_from
        self.init_weights_only = init_weights_only
        self.init_ignore = tuple(init_ignore)
        self._group, self._own_group = process_group, False
        _, world = writer.dist_info(process_group)
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
        if self._own_group:
            # Closed by functrain's teardown (held weakly) before the process groups are
            # destroyed: the save in flight needs its group, and a group still referenced is
            # never freed (its gloo threads would live into interpreter exit).
            teardown.on_exit(self.close)

    @staticmethod
    def _keep_every(value) -> int | Time | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"keep_every must be >= 1, got {value}")
            return value
        value = Time.coerce(value)
        if value.unit not in _COUNT_FIELDS or value.value <= 0:
            raise ValueError(
                f"keep_every={value} cannot be checked against a checkpoint; use an int of steps "
                "or a positive Time in ep, ba, sp or tok units"
            )
        return value

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
        step is kept and its URL returned, unless `force=True`, which rewrites it.

        Args:
            state: the `TrainState` (any pytree with an int `step`).
            force: rewrite an existing checkpoint of the same step.
        Returns:
            the checkpoint's URL (committed once `wait()` returns, for asynchronous saves).
        """
        self._check_open()
        self.wait()
        step = getattr(state, "step", None)
        if not isinstance(step, int):
            raise TypeError(
                f"Manager.save needs a state with an int `step`, got {type(state).__name__}"
            )
        loc = self.root.child(step_dir_name(step))
        if not force and writer.committed(loc):
            return loc.url
        buffers = self._buffers if self.async_save else None
        staged = writer.stage(state, copy=self.async_save, buffers=buffers, group=self._group)
        job = functools.partial(self._write, staged, loc, force)
        if self._executor is not None:
            self._pending = (self._executor.submit(job), loc.url, step)
        else:
            job()
        return loc.url

    def _write(self, staged: writer.Staged, loc: storage.Location, overwrite: bool) -> None:
        writer.write(
            staged,
            loc,
            group=self._group,
            overwrite=overwrite,
            before_write=self._collect_garbage,
        )
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

    def _collect_garbage(self) -> None:
        """Delete what interrupted saves and deletions left behind (rank 0, before a save).

        Leftovers come from earlier processes, so one pass per manager suffices (on object
        stores it lists the whole root).
        """
        if self._collected:
            return
        self._collected = True
        if self.root.is_local:
            for name in storage.list_dirs(self.root):
                if _STALE.match(name):
                    storage.delete_dir(self.root.child(name))
            return
        done = {name for _, loc in _committed(self.root) for name in [loc.name]}
        for name in storage.list_dirs(self.root):
            if STEP_DIR.match(name) and name not in done:
                storage.delete_dir(self.root.child(name))

    def _apply_retention(self) -> None:
        found = _committed(self.root)
        counts, period = None, self.keep_every
        if isinstance(period, Time):
            counts = {step: self._count(loc, period) for step, loc in found}
            period = period.value
        keep = retained_steps(
            [s for s, _ in found], keep_last=self.keep_last, keep_every=period, counts=counts
        )
        for step, loc in found:
            if step not in keep:
                self._delete(loc)

    @staticmethod
    def _count(loc: storage.Location, period: Time) -> float | None:
        data = storage.read_bytes(loc, layout.COMMIT_FILE)
        try:
            timestamp = layout.parse_json(data or b"", loc.url, "commit marker").get("timestamp")
            return float(timestamp[_COUNT_FIELDS[period.unit]])
        except (CheckpointError, AttributeError, KeyError, TypeError, ValueError):
            return None  # no timestamp recorded: only keep_last applies to it

    @staticmethod
    def _delete(loc: storage.Location) -> None:
        """Delete a checkpoint so that no crash leaves a committed-looking partial one."""
        if loc.is_local:
            doomed = loc.sibling(loc.name + ".deleting")
            storage.delete_dir(doomed)
            storage.rename_dir(loc, doomed)
            storage.delete_dir(doomed)
        else:
            storage.delete_file(loc, layout.COMMIT_FILE)
            storage.delete_dir(loc)

    # -- finding and restoring ------------------------------------------------------------------

    def checkpoints(self) -> list[tuple[int, str]]:
        """The committed checkpoints as `[(step, url), ...]`, oldest first."""
        return [(step, loc.url) for step, loc in _committed(self.root)]

    def latest(self) -> str | None:
        """The URL of the newest committed checkpoint, or None (saves in flight are not counted)."""
        found = _committed(self.root)
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
        """Load the newest committed checkpoint into `like`'s structure and placements.

        Falls back to `init_from` (weights only, by default) when `root` holds no checkpoint.

        Args:
            like: the freshly initialised state (or its abstract shape).
            weights_only: load only params and buffers.
            ignore: glob patterns of keys that keep `like`'s values.
            strict: see `functrain.checkpoint.load`.
            inplace: copy into `like`'s tensors instead of returning new ones.
        Returns:
            the restored state, or None when there is nothing to restore.
        """
        self._check_open()
        self.wait()
        path = self.latest()
        if path is None:
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
        state = reader.load(
            path,
            like,
            strict=strict,
            ignore=ignore,
            weights_only=weights_only,
            inplace=inplace,
            storage_options=self.storage_options,
        )
        timestamp = getattr(state, "timestamp", None)
        if self.every is not None and isinstance(timestamp, Timestamp):
            count, period = self._progress(timestamp)
            self._last_index = math.floor(count / period + 1e-9) if period > 0 else None
        return state

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for the save in flight, then release the thread and the process group."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
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
