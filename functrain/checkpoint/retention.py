"""A Manager root's housekeeping: which checkpoints exist, which to keep, what to clean up, and
how a damaged one is set aside.

    <root>/step_000000100/                 committed (listed by `committed_steps`)
    <root>/step_000000200.tmp|.old|.deleting/   leftovers of interrupted saves and deletions
    <root>/step_000000300.corrupt-chunk/   set aside by auto-resume: never deleted, never listed

Only the run that holds the root's lease calls the functions that change it (rank 0).

Example:
    >>> sorted(retained_steps([10, 20, 30, 40, 50], keep_last=2, keep_every=20))
    [20, 40, 50]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from . import layout, storage, writer

_STALE = re.compile(r"^step_\d+\.(tmp|old|deleting)$")
_COMMIT_KEY = re.compile(r"^(step_\d+)/" + re.escape(layout.COMMIT_FILE) + r"$")


def committed_steps(root: storage.Location) -> list[tuple[int, storage.Location]]:
    """The committed checkpoints of a root as `[(step, location)]`, oldest first."""
    if root.is_local:
        steps = [
            (step, root.child(name))
            for name in storage.list_dirs(root)
            if (step := layout.dir_step(name)) is not None
        ]
        found = [(s, loc) for s, loc in steps if writer.committed(loc)]
    else:  # one listing instead of one request per directory
        found = [
            (step, root.child(m.group(1)))
            for key in storage.list_keys(root)
            if (m := _COMMIT_KEY.match(key)) and (step := layout.dir_step(m.group(1))) is not None
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


def collect_garbage(root: storage.Location) -> None:
    """Delete what interrupted saves and deletions left behind (`.tmp`, `.old`, `.deleting`
    directories; on object stores, step directories without a commit marker)."""
    if root.is_local:
        for name in storage.list_dirs(root):
            if _STALE.match(name):
                storage.delete_dir(root.child(name))
        return
    done = {loc.name for _, loc in committed_steps(root)}
    for name in storage.list_dirs(root):
        if layout.dir_step(name) is not None and name not in done:
            storage.delete_dir(root.child(name))


def delete_checkpoint(loc: storage.Location) -> None:
    """Delete a checkpoint so that no crash leaves a committed-looking partial one."""
    if loc.is_local:
        doomed = loc.sibling(loc.name + ".deleting")
        storage.delete_dir(doomed)
        storage.rename_dir(loc, doomed)
        storage.delete_dir(doomed)
    else:
        storage.delete_file(loc, layout.COMMIT_FILE)
        storage.delete_dir(loc)


def set_aside(loc: storage.Location, reason: str) -> str:
    """Move a damaged checkpoint out of the way, keeping every byte: `step_N.corrupt-<reason>`.

    The new name matches no pattern `latest()` or the clean-up look for, so it is neither
    resumed nor deleted; a later checkpoint of the same step can be saved beside it.

    Returns:
        the new directory name.
    """
    reason = reason if reason in layout.SET_ASIDE_REASONS else "damaged"
    taken = set(storage.list_dirs(loc.parent))
    name, n = f"{loc.name}.corrupt-{reason}", 1
    while name in taken:
        n += 1
        name = f"{loc.name}.corrupt-{reason}-{n}"
    target = loc.sibling(name)
    if loc.is_local:
        storage.rename_dir(loc, target)
    else:  # no rename on object stores: copy, un-commit the original, then remove it
        storage.copy_dir(loc, target)
        storage.delete_file(loc, layout.COMMIT_FILE)
        storage.delete_dir(loc)
    return name


def commit_count(loc: storage.Location, field: str) -> float | None:
    """A counter (`epoch`, `batch`, ...) of the timestamp COMMIT.json records, or None."""
    try:
        data = storage.read_bytes(loc, layout.COMMIT_FILE)
        timestamp = layout.parse_json(data or b"", loc.url, "commit marker").get("timestamp")
        value = timestamp[field]
    except (ValueError, AttributeError, KeyError, TypeError):  # CheckpointError is a ValueError
        return None  # no timestamp recorded: only keep_last applies to it
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def commit_metric(loc: storage.Location, name: str) -> float | None:
    """A metric COMMIT.json records (`Manager.save(metrics=...)`), or None when it has none."""
    try:
        data = storage.read_bytes(loc, layout.COMMIT_FILE)
        value = layout.parse_json(data or b"", loc.url, "commit marker").get("metrics")[name]
    except (ValueError, AttributeError, KeyError, TypeError):  # CheckpointError is a ValueError
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def best_steps(values: Mapping[int, float], keep_best: int, mode: str) -> set[int]:
    """The `keep_best` steps with the highest (`mode="max"`) or lowest ("min") value; on a tie
    the newer step wins.

    Example:
        >>> sorted(best_steps({1: 0.5, 2: 0.9, 3: 0.7}, 2, "max"))
        [2, 3]
    """
    sign = 1.0 if mode == "max" else -1.0
    ranked = sorted(values, key=lambda step: (sign * values[step], step), reverse=True)
    return set(ranked[:keep_best])


__all__ = [
    "best_steps",
    "collect_garbage",
    "commit_count",
    "commit_metric",
    "committed_steps",
    "delete_checkpoint",
    "retained_steps",
    "set_aside",
]
