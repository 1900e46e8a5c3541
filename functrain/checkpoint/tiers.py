"""A fast local tier of checkpoints beside a `Manager`'s persistent root.

Every `every` steps each rank writes its own part of the state (plain tensors, and the local
shards of DTensors) to node-local storage, and a replica of it to its peer's local tier -- the
folder of a rank on another node, so that losing one node loses no rank's snapshot:

    <path>/rank<r>/step_000000015/            rank r's own snapshot (its node)
    <peer>/replica-rank<r>/step_000000015/    rank r's replica (the next node)

A snapshot is rank-local: it restores only into the same ranks and mesh (a restart of the same
job), which is what a fast tier is for; the persistent root restores under any mesh.

Saves are asynchronous by default: the step waits only for the copy of this rank's state into
host buffers (reused save after save), and a worker thread writes both copies and applies
retention; the next save, a restore or `close` waits for it. A snapshot still being written when
the process dies is not committed, and a restart takes the one before it.

Restoring, every rank lists the steps it can load (own snapshot, else its replica) and all ranks
take the minimum of the newest each has, so that they resume from one step; a step that fails
to load on any rank is dropped for all and the next older one is tried. Nothing newer than the
root's newest checkpoint: the manager falls back to the root.

Example:
    >>> manager = Manager("s3://bucket/run", every="1000ba",
    ...                   local=LocalTier("/dev/shm/run", every=50, peer="/mnt/node2/run"))
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ..tree import tree_map
from . import layout, reader, retention, storage, writer
from .background import BackgroundWriter
from .staging import dist_info

logger = logging.getLogger("functrain.checkpoint")
_OWNER = "ROOT_URL"  # in each snapshot folder: the root the snapshots belong to


@dataclasses.dataclass(frozen=True)
class LocalTier:
    """Where and how often a `Manager` writes its fast local snapshots.

    Args:
        path: this node's local folder (`/dev/shm/<run>`, a local disk).
        every: save a snapshot every this many steps (batches).
        peer: the local folder of the rank on the next node, where this rank's replica goes
            (None: no replica; losing the node then loses its ranks' snapshots).
        keep_last: how many snapshots each rank keeps in each folder.
        async_save: write in a background thread (the step waits only for the copy to host
            memory); False: `save` returns once both copies are committed.
    Example:
        >>> LocalTier("/dev/shm/run", every=50, peer="/mnt/node2/run", keep_last=2)
    """

    path: str | os.PathLike
    every: int
    peer: str | os.PathLike | None = None
    keep_last: int = 2
    async_save: bool = True

    def __post_init__(self) -> None:
        for name, value in (("every", self.every), ("keep_last", self.keep_last)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LocalTier({name}=...) must be a positive int, got {value!r}")
        if not isinstance(self.async_save, bool):
            raise TypeError(
                f"LocalTier(async_save=...) must be True or False, got {self.async_save!r}"
            )
        if os.fspath(self.path) == os.fspath(self.peer or ""):
            raise ValueError(
                f"LocalTier(peer=...) is the tier's own folder {self.path!r}: a replica must be "
                "on another node's storage (or peer=None for no replica)"
            )

    def due(self, batch: int, last: int | None) -> bool:
        """True when `batch` completed an interval of `every` past the snapshot at `last`."""
        return batch // self.every > (0 if last is None else last // self.every)

    def folders(self, rank: int) -> list[storage.Location]:
        """Rank `rank`'s snapshot folders: its own, then its replica (if any)."""
        found = [storage.resolve(os.path.join(os.fspath(self.path), f"rank{rank}"))]
        if self.peer is not None:
            found.append(storage.resolve(os.path.join(os.fspath(self.peer), f"replica-rank{rank}")))
        return found


def local_view(tree: Any) -> Any:
    """`tree` with every DTensor replaced by this rank's shard of it."""
    return tree_map(lambda x: x.to_local() if isinstance(x, DTensor) else x, tree)


def _global_view(loaded: Any, like: Any) -> Any:
    """Loaded local shards made DTensors again, placed as in `like`."""

    def back(value: Any, ref: Any) -> Any:
        if isinstance(ref, DTensor) and isinstance(value, torch.Tensor):
            return DTensor.from_local(
                value, ref.device_mesh, ref.placements, run_check=False,
                shape=ref.shape, stride=ref.stride(),
            )  # fmt: skip
        return value

    return tree_map(back, loaded, like)


def _committed(loc: storage.Location) -> list[tuple[int, storage.Location]]:
    if not os.path.isdir(loc.local_path):
        return []
    return retention.committed_steps(loc)


class Tiers:
    """A `LocalTier` as one rank of a run uses it.

    Args:
        tier: the tier's folders and interval.
        rank: this rank (in the run's group).
        group: the run's ranks (agreement on the step to restore).
        owner: the URL of the manager's root: each folder records it, and a restore ignores a
            folder written for another root (a crashed earlier run's, say).
    Example:
        >>> tiers = Tiers(LocalTier("/dev/shm/run", every=50), rank=0, owner="s3://bucket/run")
        >>> tiers.open()
        >>> if tiers.due(state.timestamp.batch):
        ...     tiers.save(state, state.step, state.timestamp.batch)
        >>> tiers.close()
    """

    def __init__(self, tier: LocalTier, rank: int, group=None, owner: str = ""):
        self.tier, self.rank, self.group, self.owner = tier, rank, group, owner
        self.solo = None  # a group of this rank alone: writes without collectives
        self.last: int | None = None  # the batch of the last snapshot written or restored
        self.background: BackgroundWriter | None = None  # made by `open`

    @classmethod
    def of(cls, local: Any, rank: int, group, owner: str) -> Tiers | None:
        """`Manager(local=...)` as `Tiers` (None: no local tier).

        Raises:
            TypeError: `local` is not a `LocalTier`.
        """
        if local is None:
            return None
        if not isinstance(local, LocalTier):
            raise TypeError(f"Manager(local=...) takes a LocalTier or None, got {local!r}")
        return cls(local, rank, group, owner)

    def open(self) -> None:
        """Make the one-rank group local writes use (collective, once) and the writing thread."""
        _, world = dist_info(self.group)
        if world > 1 and self.solo is None:
            self.solo, _ = torch.distributed.new_subgroups(group_size=1, backend="gloo")
        if self.background is None:
            self.background = BackgroundWriter(self.tier.async_save, self.solo)
        self.background.group = self.solo  # (a group `close` destroyed is never used again)
        self.background.open()

    def wait(self) -> None:
        """Block until the snapshot being written (if any) is committed.

        Raises:
            CheckpointError: that write failed.
        """
        if self.background is not None:
            self.background.wait()

    def release(self) -> None:
        """Wait for the snapshot in flight and stop the writing thread (`open` starts it again)."""
        if self.background is not None:
            try:
                self.background.wait()
            finally:
                self.background.close()

    def close(self) -> None:
        """Wait for the snapshot in flight, stop the thread and give the one-rank group back."""
        try:
            self.release()
        finally:
            if self.solo is not None:
                torch.distributed.destroy_process_group(self.solo)
                self.solo = None

    def due(self, batch: int) -> bool:
        """True when a snapshot is due after `batch`."""
        return self.tier.due(batch, self.last)

    def save(self, state: Any, step: int, batch: int) -> str:
        """Write this rank's snapshot of `state` (and its replica), then apply retention; in
        the background when the tier is asynchronous (call `open` first).

        Returns:
            the URL of this rank's own snapshot (committed once `wait` returns).
        """
        if self.background is None:
            raise RuntimeError("Tiers.save before Tiers.open: open the tier first")
        self.background.wait()  # one snapshot in flight: the host buffers are reused
        staged = self.background.stage(local_view(state))
        folders = self.tier.folders(self.rank)
        url = folders[0].child(layout.step_dir_name(step)).url
        self.background.submit(lambda: self._write(staged, folders, step), url, step)
        self.last = batch
        return url

    def _write(self, staged: Any, folders: list[storage.Location], step: int) -> None:
        for folder in folders:
            storage.make_dir(folder)
            if storage.read_bytes(folder, _OWNER) != self.owner.encode():
                storage.write_bytes(folder, _OWNER, self.owner.encode())
            retention.collect_garbage(folder)
            loc = folder.child(layout.step_dir_name(step))
            writer.write(staged, loc, overwrite=True, group=self.solo)
            keep = retention.retained_steps(
                [s for s, _ in _committed(folder)], keep_last=self.tier.keep_last
            )
            for old, old_loc in _committed(folder):
                if old not in keep:
                    retention.delete_checkpoint(old_loc)

    def restore(
        self, like: Any, options: dict, newer_than: int
    ) -> tuple[Any, int, storage.Location] | None:
        """Load the newest snapshot step every rank can load, if newer than `newer_than`
        (collective: every rank resumes from the same step).

        Returns:
            `(state, step, location)` or None when no such step is left.
        """
        self.wait()
        found: dict[int, list[storage.Location]] = {}
        for folder in self.tier.folders(self.rank):
            try:
                written_for = storage.read_bytes(folder, _OWNER) if _committed(folder) else None
                if written_for is not None and written_for != self.owner.encode():
                    logger.warning(
                        "functrain.checkpoint: ignoring the local snapshots in %s: they were "
                        "written for the root %s, not %s",
                        folder.url, written_for.decode(errors="replace"), self.owner,
                    )  # fmt: skip
                    continue
                for step, loc in _committed(folder):
                    found.setdefault(step, []).append(loc)
            except Exception as err:  # noqa: BLE001 -- a damaged tier falls back, loudly
                logger.warning("functrain.checkpoint: cannot list %s (%s)", folder.url, err)
        bound = None
        while True:
            mine = [s for s in found if s > newer_than and (bound is None or s < bound)]
            agreed = -writer.max_over_ranks(-(max(mine) if mine else -1), self.group)
            if agreed <= newer_than:
                return None
            loaded, used = None, None
            for loc in found.get(agreed, []):
                try:
                    loaded, used = reader.load(loc, local_view(like), **options), loc
                    break
                except Exception as err:  # noqa: BLE001 -- damaged, unreadable: try the replica
                    logger.warning(
                        "functrain.checkpoint: local snapshot %s cannot be restored (%s)",
                        loc.url,
                        str(err).splitlines()[0][:300],
                    )
            if writer.agree(used is not None, self.group):
                assert used is not None
                self.last = getattr(getattr(loaded, "timestamp", None), "batch", agreed)
                return _global_view(loaded, like), agreed, used
            bound = agreed

    def remove(self) -> None:
        """Delete this rank's snapshots and replica (the run is over: they must not outlive
        the root's lease, or a later run could resume from them)."""
        self.wait()
        for folder in self.tier.folders(self.rank):
            if os.path.isdir(folder.local_path):
                storage.delete_dir(folder)


__all__ = ["LocalTier", "Tiers", "local_view"]
