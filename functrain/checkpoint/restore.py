"""Restoring a run: the newest committed checkpoint that verifies, agreed on by every rank.

Rank 0 lists the root and names the newest checkpoint not yet tried; every rank loads it and
reports how it went (loaded, a kind of damage, or another failure). All ranks take the worst
report: a damaged checkpoint is set aside (`step_N.corrupt-<reason>`) and the next older one is
tried, so that every rank resumes from the same step; any other failure stops the restore on
every rank (it is not the checkpoint's fault).

Example:
    >>> state, step, loc = restore_newest(root, like, {"strict": True}, fallback=True)
"""

from __future__ import annotations

from typing import Any

from . import layout, reader, storage, writer
from .errors import CheckpointCorruptError, CheckpointError
from .root import Root, committed
from .tiers import Tiers

# What each rank reports after trying a checkpoint: 0 loaded, 1.. a kind of damage, then any
# other failure.
_OTHER_FAILURE = len(layout.SET_ASIDE_REASONS) + 1


def restore_newest(
    root: Root, like: Any, options: dict, *, fallback: bool, tiers: Tiers | None = None
) -> tuple[Any, int, storage.Location] | None:
    """Load the newest committed checkpoint of `root` that verifies, or a snapshot of the local
    `tiers` newer than it that every rank can load (collective).

    Args:
        root: the Manager root (its lease taken).
        like: the structure to load into.
        options: keyword arguments of `reader.load` (strict, ignore, weights_only, inplace).
        fallback: set a damaged checkpoint aside and try the next older one; False: raise.
        tiers: the manager's local tier, if any.
    Returns:
        `(state, its step, its location)`, or None when no checkpoint is left to try.
    Raises:
        CheckpointCorruptError: the newest checkpoint is damaged and `fallback` is False.
        CheckpointError: a rank failed for another reason.
    """
    if tiers is not None:
        listed = committed(root.loc) if root.rank == 0 else []
        shared = writer.share_text(str(listed[-1][0] if listed else -1), root.group)
        snapshot = tiers.restore(like, options, newer_than=int(shared or -1))
        if snapshot is not None:
            return snapshot
    tried: set[int] = set()
    while True:
        newest = None
        if root.rank == 0:
            found = [s for s, _ in committed(root.loc) if s not in tried]
            newest = str(found[-1]) if found else None
        chosen = writer.share_text(newest, root.group)
        if chosen is None:
            return None
        step = int(chosen)
        tried.add(step)
        loc = root.loc.child(layout.step_dir_name(step))
        error, code = None, 0
        try:
            state = reader.load(loc, like, **options)
        except Exception as err:  # noqa: BLE001 -- classified, then shared with every rank
            error, code = err, _OTHER_FAILURE
            if isinstance(err, CheckpointCorruptError):
                reasons = layout.SET_ASIDE_REASONS
                code = 1 + (reasons.index(err.reason) if err.reason in reasons else 0)
        worst = writer.max_over_ranks(code, root.group)
        if worst == 0:
            return state, step, loc
        if worst == _OTHER_FAILURE:
            if error is not None and not isinstance(error, CheckpointCorruptError):
                raise error
            raise CheckpointError(f"another rank failed restoring {loc.url}; see its error")
        reason = layout.SET_ASIDE_REASONS[worst - 1]
        if not fallback:
            found_text = str(error) if error is not None else f"another rank found {reason} damage"
            raise CheckpointCorruptError(
                f"{found_text}\nThe newest checkpoint {loc.url} is damaged; this Manager has "
                "fallback=False. To resume from the previous one, move it aside (e.g. rename "
                f"it to {loc.name}.corrupt-manual), or use Manager(fallback=True), which "
                "does that",
                reason=reason,
            ) from error
        root.set_aside(loc, reason, error)


__all__ = ["restore_newest"]
