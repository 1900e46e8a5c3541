"""`Manager`: periodic, asynchronous, atomic checkpoints of a run, with retention and auto-resume.

A small facade over the four parts of the job, each in its own module:

- `schedule.SaveSchedule`: when a save is due (a pure question about the run's position);
- `background.BackgroundWriter`: the copy off the device and the write in a worker thread;
- `root.Root`: the directory of checkpoints -- its lease, listing, retention and set-aside;
- `restore.restore_newest`: the newest checkpoint that verifies, agreed on by every rank;
- `tiers.Tiers`: the optional fast local tier (`local=LocalTier(...)`) between root saves.

`save(state)` blocks only for the copy off the device; retention runs after each commit, never
deleting the newest. `restore(like)` loads the newest checkpoint that verifies (a damaged newer
one is set aside as `step_N.corrupt-<reason>`), or on a fresh run the weights of `init_from`.

The first `save` or `restore` takes the root's lease: a second run on the same root gets a
`CheckpointLeaseError` naming the owner instead of deleting the first run's saves. Whoever makes
a manager closes it: `close()`, or `with Manager(...) as manager:`. `fit` finishes the saves of a
manager it was given and gives back its lease, thread and group when it returns; the manager
stays usable (its next save or restore takes them again).

Example:
    >>> with Manager("s3://bucket/run", every="1ep", keep_last=3,
    ...              storage_options={"endpoint": "http://127.0.0.1:9000"}) as manager:
    ...     state = manager.restore(like=state) or state
    ...     if manager.should_save(state.timestamp):
    ...         manager.save(state)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..units import Time, Timestamp
from . import layout, reader, storage, writer
from .background import BackgroundWriter
from .errors import CheckpointError
from .lease import DEFAULT_TTL, check_ttl
from .restore import restore_newest
from .root import (
    Root,
    check_keep_last,
    committed,
    finite_metrics,
    parse_best,
    parse_keep_every,
    written_by,
)
from .schedule import SaveSchedule
from .staging import Staged
from .tiers import LocalTier, Tiers

OnCommit = Callable[[int, str], None]


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
        on_commit: functions `(step, url) -> None` called on every rank after each commit (in
            the writing thread); more can be added with `subscribe`.
        keep_best: also keep the `keep_best` checkpoints with the best `monitor` value (Lightning's
            `save_top_k`); the value is recorded in each checkpoint's COMMIT.json, so a resumed
            run ranks the checkpoints of the run it resumes. `fit` records its last evaluation's
            results ("eval/accuracy", ...) with each save; `save(metrics=...)` otherwise.
        monitor: the metric `keep_best` ranks by, e.g. "eval/accuracy".
        mode: "max" (higher is better) or "min".
        local: a `LocalTier`: fast rank-local snapshots (and peer replicas) between the saves
            to `root`; `restore` takes the newest step every rank can load from either.
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
        on_commit: Sequence[OnCommit] = (),
        keep_best: int | None = None,
        monitor: str | None = None,
        mode: str = "max",
        local: LocalTier | None = None,
    ):
        loc = storage.resolve(root, storage_options)
        self.storage_options = storage_options
        self.schedule = SaveSchedule.parse(every)
        for name, flag in (
            ("async_save", async_save),
            ("init_weights_only", init_weights_only),
            ("fallback", fallback),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if isinstance(init_ignore, str):
            raise TypeError(f"init_ignore must be a list of globs, got the string {init_ignore!r}")
        check_ttl(lease_ttl)
        check_keep_last(keep_last)
        keep_every = parse_keep_every(keep_every)
        best = parse_best(keep_best, monitor, mode)
        self.async_save = async_save
        self.init_from = init_from
        self.init_weights_only = init_weights_only
        self.init_ignore = tuple(init_ignore)
        self.fallback = fallback
        self.restored_from: str | None = None  # the checkpoint the last `restore` loaded
        self._on_commit: list[OnCommit] = []
        for fn in on_commit:
            self.subscribe(fn)
        self._background = BackgroundWriter(async_save, process_group)
        self._root = Root(
            loc,
            lease_ttl=lease_ttl,
            rank=self._background.rank,
            group=lambda: self._background.group,  # the writer's current group, never a stale one
            keep_last=keep_last,
            keep_every=keep_every,
            best=best,
        )
        self.keep_last, self.keep_every = keep_last, keep_every  # (what the root applies)
        self._last_index: int | None = None  # the schedule's index of the last save or restore
        self._known: set[int] = set()  # steps this manager wrote or restored
        self._tiers = Tiers.of(local, self._root.rank, process_group, loc.url)
        self._closed = False

    @property
    def root(self) -> storage.Location:
        """The root's location."""
        return self._root.loc

    @property
    def every(self) -> Time | None:
        """The save interval (None: only when asked)."""
        return self.schedule.every

    def subscribe(self, fn: OnCommit) -> None:
        """Call `fn(step, url)` after each commit (once, however often it is subscribed)."""
        if not callable(fn):
            raise TypeError(f"on_commit takes functions (step, url) -> None, got {fn!r}")
        if fn not in self._on_commit:
            self._on_commit.append(fn)

    # -- when to save -------------------------------------------------------------------------

    def should_save(self, timestamp: Timestamp) -> bool:
        """True when the run has completed an interval of `every` since the last save (or the
        restore it resumed from), or a snapshot of the local tier is due; before either, since
        the start of the run. A question: `save` records what was saved.
        """
        local = self._tiers is not None and self._tiers.due(timestamp.batch)
        return local or self.schedule.due(timestamp, self._last_index)

    # -- saving -------------------------------------------------------------------------------

    def save(
        self, state: Any, force: bool = False, *, metrics: dict | None = None, scheduled=False
    ) -> str:
        """Save `state` as the checkpoint of step `state.step` (asynchronously by default).

        The caller decides when (usually with `should_save`). A committed checkpoint of the same
        step that this manager wrote or restored is kept and its URL returned, unless
        `force=True`, which rewrites it; one it did not (another run's) is an error.

        Args:
            state: the `TrainState` (any pytree with an int `step`).
            force: rewrite an existing checkpoint of the same step.
            metrics: `{name: number}` recorded with the checkpoint (what `keep_best` ranks by);
                values that are not finite numbers are left out.
            scheduled: save only to the tiers `should_save` found due (else always to `root`).
        Returns:
            the checkpoint's URL (committed once `wait()` returns, for asynchronous saves).
        Raises:
            CheckpointLeaseError: another run owns the root.
            CheckpointError: the root already holds another run's checkpoint of this step.
        """
        self._check_open()
        self.wait()
        self._open()
        step = getattr(state, "step", None)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise TypeError(
                f"Manager.save needs a state with a non-negative int `step`, got "
                f"{type(state).__name__} with step {step!r}"
            )
        self._root.take_lease()
        timestamp: Any = getattr(state, "timestamp", None)
        batch = timestamp.batch if isinstance(timestamp, Timestamp) else step
        if self._tiers is not None and self._tiers.due(batch):
            url = self._tiers.save(state, step, batch)  # asynchronous unless the tier says not
            if scheduled and not self.schedule.due(timestamp, self._last_index):
                return url
        loc = self.root.child(layout.step_dir_name(step))
        self._mark(timestamp)
        if not force and writer.committed(loc):
            if step in self._known:
                return loc.url
            raise CheckpointError(
                f"{loc.url} already holds a checkpoint of step {step} that this run neither "
                f"wrote nor resumed from ({written_by(loc)}). Resume it (fit(autoresume=True) "
                "or Manager.restore), save with force=True to replace it, or give this run "
                "another root"
            )
        recorded = finite_metrics(metrics)
        staged = self._background.stage(state)
        job = lambda: self._write(staged, loc, force, step, recorded)  # noqa: E731
        self._background.submit(job, loc.url, step)
        return loc.url

    def _mark(self, timestamp: Any) -> None:
        """Record the schedule's position of what was saved or restored."""
        if isinstance(timestamp, Timestamp):
            index = self.schedule.index(timestamp)
            if index is not None:
                self._last_index = max(index, self._last_index or 0)

    def _write(self, staged: Staged, loc, overwrite: bool, step: int, metrics: dict) -> None:
        self._root.write(staged, loc, overwrite=overwrite, metrics=metrics)
        self._known.add(step)
        for fn in self._on_commit:
            fn(step, loc.url)

    def wait(self) -> None:
        """Block until the asynchronous saves in flight (the root's, the local tier's) commit.

        Raises:
            CheckpointError: when that save failed (the error of the background thread).
        """
        self._background.wait()
        if self._tiers is not None:
            self._tiers.wait()

    # -- finding and restoring ------------------------------------------------------------------

    def checkpoints(self) -> list[tuple[int, str]]:
        """The committed checkpoints as `[(step, url), ...]`, oldest first."""
        return [(step, loc.url) for step, loc in committed(self.root)]

    def latest(self) -> str | None:
        """The URL of the newest committed checkpoint, or None (saves in flight are not counted)."""
        found = committed(self.root)
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
        self._open()
        self._root.take_lease()
        options = dict(strict=strict, ignore=ignore, weights_only=weights_only, inplace=inplace)
        self.restored_from = None
        found = restore_newest(self._root, like, options, fallback=self.fallback, tiers=self._tiers)
        self._root.housekeeping()
        if found is None:
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
        state, step, loc = found
        self.restored_from = loc.url
        self._known.add(step)
        timestamp = getattr(state, "timestamp", None)
        if self._tiers is not None:  # the next local snapshot is due an interval after it
            self._tiers.last = getattr(timestamp, "batch", step)
        if isinstance(timestamp, Timestamp):
            self._last_index = self.schedule.index(timestamp)
        return state

    # -- lifetime -----------------------------------------------------------------------------

    def release(self, wait: bool = True) -> None:
        """Finish the save in flight and give the root's lease up, keeping the manager usable:
        its next `save` or `restore` takes the lease again (`fit` calls this when it returns).

        Args:
            wait: wait for the save in flight; False: keep the lease while one is in flight
                (its commit checks the lease), release it otherwise.
        Raises:
            CheckpointError: the save in flight failed (`wait=True`).
        """
        if self._closed:
            return
        if not wait and self._background.pending:
            return
        try:
            self.wait()
        finally:
            self._root.release_lease()
            self._background.close()  # no thread or group outlives the run that used them
            if self._tiers is not None:
                self._tiers.release()

    def close(self, keep_local: bool = False) -> None:
        """Wait for the save in flight, apply retention, release the lease, the thread and the
        process group, and delete this rank's local tier (`keep_local`: keep it for a restart;
        `with` keeps it when an exception ends the block). A closed manager cannot save or
        restore again."""
        if self._closed:
            return
        try:
            self.wait()
            self._root.close()
        finally:
            self._closed = True
            self._root.release_lease()
            self._background.close()
            if self._tiers is not None:
                self._tiers.close()
                if not keep_local:
                    self._tiers.remove()

    def _open(self) -> None:
        """The thread and group `release` gave back, made again (collective)."""
        self._background.open()
        if self._tiers is not None:
            self._tiers.open()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this Manager of {self.root.url} is closed; create a new one")

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(keep_local=kind is not None)  # a run that failed is restarted from it

    def __repr__(self) -> str:
        return (
            f"Manager({self.root.url!r}, every={self.every}, keep_last={self.keep_last}, "
            f"keep_every={self.keep_every}, async_save={self.async_save})"
        )


__all__ = ["Manager"]
