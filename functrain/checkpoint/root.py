"""`Root`: a Manager's directory of checkpoints -- its lease, listing, retention and set-aside.

    <root>/step_000000100/                   committed checkpoints, listed oldest first
    <root>/step_000000200.tmp/               a save in flight, or one a crash interrupted
    <root>/step_000000300.corrupt-chunk/     set aside by a restore: kept, never listed
    <root>/LEASE.json                        the run that owns the root (see `lease`)

Rank 0 holds the lease and changes the root; every rank calls the collective methods
(`take_lease`, `housekeeping`, `set_aside`) together and raises together.

Example:
    >>> root = Root(storage.resolve("/runs/a"), lease_ttl=30.0, rank=0, keep_last=3)
    >>> root.take_lease()
    >>> root.apply_retention()
    >>> root.release_lease()
"""

from __future__ import annotations

import logging
import math
import numbers
import weakref
from typing import Any

import torch

from ..units import Time
from . import layout, retention, storage, writer
from .errors import CheckpointError, CheckpointLeaseError
from .lease import Lease
from .reachable import check_reachable

logger = logging.getLogger("functrain.checkpoint")
_COUNT_FIELDS = {"ep": "epoch", "ba": "batch", "sp": "sample", "tok": "token"}


def committed(root: storage.Location) -> list[tuple[int, storage.Location]]:
    """The committed checkpoints of a Manager root as `[(step, location)]`, oldest first.

    Raises:
        CheckpointError: `root` is not a directory (a regular file, say).
    """
    if root.is_local:
        try:
            return retention.committed_steps(root)
        except (NotADirectoryError, FileExistsError) as err:
            raise CheckpointError(
                f"{root.url} is not a directory, so it cannot be a checkpoint root ({err}); "
                "pass the directory the checkpoints are (or will be) saved in"
            ) from err
    return retention.committed_steps(root)


def checkpoints(root: Any, storage_options: dict | None = None) -> list[tuple[int, str]]:
    """The committed checkpoints under `root` as `[(step, url), ...]`, oldest first.

    Example:
        >>> checkpoints("/runs/a")
        [(100, 'file:///runs/a/step_000000100'), (200, 'file:///runs/a/step_000000200')]
    """
    loc = storage.resolve(root, storage_options)
    check_reachable(loc)
    return [(step, child.url) for step, child in committed(loc)]


def latest(root: Any, storage_options: dict | None = None) -> str | None:
    """The URL of the newest committed checkpoint under `root`, or None.

    Example:
        >>> state = functrain.checkpoint.load(latest("/runs/a"), like=state)
    """
    found = checkpoints(root, storage_options)
    return found[-1][1] if found else None


class Root:
    """A Manager root as one run uses it.

    Args:
        loc: the root's location.
        lease_ttl: the lease's ttl in seconds, or None to take no lease.
        rank: this process's rank in `group` (rank 0 holds the lease and changes the root).
        group: the ranks that save together (None: all), or a function giving them.
        keep_last: how many newest checkpoints retention keeps (None: all).
        keep_every: also keep steps that are multiples of this int, or checkpoints whose
            timestamp is a multiple of this `Time`.
        best: `(keep_best, monitor, mode)`: also keep the `keep_best` checkpoints with the best
            `monitor` value recorded in their COMMIT.json ("max" or "min"); None: no such rule.
    """

    def __init__(
        self,
        loc: storage.Location,
        *,
        lease_ttl: float | None,
        rank: int,
        group=None,
        keep_last: int | None = None,
        keep_every: int | Time | None = None,
        best: tuple[int, str, str] | None = None,
    ):
        check_reachable(loc)  # an unreachable object store fails here, fast, naming the fix
        self.loc = loc
        self.rank = rank
        # `group` may be a function giving the current group: a manager's writer makes its group
        # again after `release`, and a root holding the old group would keep it (and its gloo
        # threads) alive after it was destroyed.
        self._group_of = group if callable(group) else (lambda: group)
        self.keep_last, self.keep_every, self.best = keep_last, keep_every, best
        self.lease = Lease(loc, lease_ttl) if lease_ttl is not None and rank == 0 else None
        self.leased = lease_ttl is None
        self._collected = False  # stale directories of interrupted saves removed
        if self.lease is not None:  # released when the root goes away, or at exit
            weakref.finalize(self, self.lease.release)

    @property
    def group(self):
        """The process group of the ranks that save together (None: all)."""
        return self._group_of()

    def take_lease(self) -> None:
        """Take the lease on rank 0 (once until released); every rank raises if it could not.

        Raises:
            CheckpointLeaseError: another run owns the root.
        """
        if self.leased:
            return
        error = None
        if self.lease is not None:
            try:
                self.lease.acquire()
            except CheckpointError as err:
                error = err
        text = writer.share_text(None if error is None else str(error), self.group)
        if text is not None:
            if error is not None:
                raise error
            raise CheckpointLeaseError(f"rank 0 could not take the lease: {text}")
        self.leased = True

    def release_lease(self) -> None:
        """Stop refreshing and give the lease up; the next `take_lease` takes it again."""
        if self.lease is not None:
            self.lease.release()
        # Every rank forgets it, rank 0 (which holds the lease) and the others alike: the next
        # `take_lease` is a collective, so all ranks must enter it or none.
        self.leased = False

    def collect_garbage(self) -> None:
        """Delete what interrupted saves and deletions left behind (rank 0, once per root object:
        leftovers come from earlier processes; on object stores it lists the whole root)."""
        if not self._collected:
            self._collected = True
            retention.collect_garbage(self.loc)

    def apply_retention(self) -> None:
        """Delete the committed checkpoints that `keep_last`/`keep_every` do not keep (rank 0)."""
        found = committed(self.loc)
        counts: dict[int, float] | None = None
        period: float | None = None
        if isinstance(self.keep_every, Time):
            field = _COUNT_FIELDS[self.keep_every.unit.value]
            read = {step: retention.commit_count(loc, field) for step, loc in found}
            counts = {step: count for step, count in read.items() if count is not None}
            period = self.keep_every.value
        elif self.keep_every is not None:
            period = float(self.keep_every)
        keep = retention.retained_steps(
            [s for s, _ in found], keep_last=self.keep_last, keep_every=period, counts=counts
        )
        if self.best is not None:
            # The ranking lives in the checkpoints themselves, so a resumed run remembers it.
            keep_best, monitor, mode = self.best
            values = {step: retention.commit_metric(loc, monitor) for step, loc in found}
            ranked = {step: value for step, value in values.items() if value is not None}
            keep |= retention.best_steps(ranked, keep_best, mode)
        for step, loc in found:
            if step not in keep:
                retention.delete_checkpoint(loc)

    def write(self, staged: Any, loc: storage.Location, *, overwrite: bool, metrics: dict) -> None:
        """Write a staged state as the checkpoint at `loc` under the lease, then apply retention
        (collective; a Manager's writing thread)."""
        lease = self.lease
        writer.write(
            staged,
            loc,
            group=self.group,
            overwrite=overwrite,
            before_write=self.collect_garbage,
            before_commit=None if lease is None else lease.check,
            owner=None if lease is None else lease.owner,
            metrics=metrics,
        )
        if staged.rank == 0:
            self.apply_retention()

    def housekeeping(self) -> None:
        """Clean-up and retention outside a save (a resumed run may never save again);
        collective: every rank raises when rank 0 failed."""
        error = None
        if self.rank == 0 and self.leased:
            try:
                self.collect_garbage()
                self.apply_retention()
            except Exception as err:  # noqa: BLE001 -- re-raised once every rank knows
                error = err
        if not writer.agree(error is None, self.group):
            if error is not None:
                raise error
            raise CheckpointError(f"rank 0 failed cleaning up {self.loc.url}; see its error")

    def set_aside(self, loc: storage.Location, reason: str, error: Exception | None) -> None:
        """Rename a damaged checkpoint `step_N.corrupt-<reason>` (rank 0) and say so; collective:
        every rank sees the rename before it lists the root again."""
        failure = None
        if self.rank == 0:
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
        writer.agree(failure is None, self.group)

    def close(self) -> None:
        """Apply retention (unless another run took the root over) and release the lease."""
        try:
            if self.rank == 0 and self.leased and self.lease is not None:
                try:
                    self.lease.check()
                    self.apply_retention()
                except CheckpointLeaseError:
                    pass  # another manager took the root over: leave its checkpoints alone
        finally:
            self.release_lease()


def check_keep_last(keep_last: Any) -> None:
    """Refuse a `keep_last` that is neither a positive int nor None."""
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ValueError(f"keep_last must be a positive int or None (keep all), got {keep_last!r}")


def parse_keep_every(value: Any) -> int | Time | None:
    """`Manager(keep_every=...)` as an int of steps, a `Time` or None.

    Raises:
        TypeError, ValueError: a value retention cannot check against a checkpoint.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"keep_every must be >= 1, got {value}")
        return value
    if isinstance(value, bool):
        raise TypeError(f"keep_every must be an int, a Time or None, got {value!r}")
    value = Time.coerce(value)
    if value.unit.value not in _COUNT_FIELDS or not (
        math.isfinite(value.value) and value.value > 0
    ):
        raise ValueError(
            f"keep_every={value} cannot be checked against a checkpoint; use an int of steps "
            "or a positive Time in ep, ba, sp or tok units"
        )
    return value


def written_by(loc: storage.Location) -> str:
    """Who wrote a checkpoint, from its COMMIT.json (best effort, for messages)."""
    try:
        commit = layout.parse_json(storage.read_bytes(loc, layout.COMMIT_FILE) or b"{}", "", "")
        who = commit.get("writer") or {}
        return (
            f"written {commit.get('time', 'at an unknown time')} by host {who.get('host')!r}, "
            f"pid {who.get('pid')!r}"
        )
    except Exception:  # noqa: BLE001
        return "written by an unknown run"


def parse_best(keep_best: Any, monitor: Any, mode: Any) -> tuple[int, str, str] | None:
    """`(keep_best, monitor, mode)` checked, or None without `keep_best`."""
    if keep_best is None:
        return None
    if isinstance(keep_best, bool) or not isinstance(keep_best, int) or keep_best < 1:
        raise ValueError(f"keep_best must be a positive int or None, got {keep_best!r}")
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(
            f"keep_best={keep_best} ranks checkpoints by a metric: name it, e.g. "
            "Manager(keep_best=2, monitor='eval/accuracy', mode='max')"
        )
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    return keep_best, monitor, mode


def finite_metrics(metrics: Any) -> dict[str, float]:
    """The finite numbers of `metrics` as floats (a NaN cannot be ranked)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict of names to numbers, got {metrics!r}")
    out = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            if math.isfinite(float(value)):
                out[str(name)] = float(value)
    return out


__all__ = [
    "Root",
    "check_keep_last",
    "checkpoints",
    "committed",
    "finite_metrics",
    "latest",
    "parse_best",
    "parse_keep_every",
    "written_by",
]
