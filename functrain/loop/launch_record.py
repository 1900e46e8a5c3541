"""The record a rank under `python -m functrain.launch` leaves after each checkpoint commit.

The launcher names a folder in `FUNCTRAIN_LAUNCH_STATUS`; `fit` subscribes `record_commit` to the
`Manager` it runs (`Manager.subscribe`), so that the launcher's last line can say at which step
every rank checkpointed. Outside a launch (the variable unset) `fit` subscribes nothing. The
launcher reads the record with `functrain.launch.status.read_records` (the package may not import
the launcher, so the rank's side of that record is written here).

Example:
    >>> if launched():
    ...     manager.subscribe(record_commit)
"""

from __future__ import annotations

import json
import os
import time

STATUS_ENV = "FUNCTRAIN_LAUNCH_STATUS"  # the launcher's name for it (functrain.launch.status)


def launched() -> bool:
    """True in a rank of `python -m functrain.launch` (its status folder exists)."""
    folder = os.environ.get(STATUS_ENV, "")
    return folder != "" and os.path.isdir(folder)


def record_commit(step: int, url: str) -> None:
    """Write `rank<R>.checkpoint.json` (step, URL, time) for the launcher; nothing outside a launch.

    Args:
        step: the committed checkpoint's step.
        url: its URL.
    """
    folder = os.environ.get(STATUS_ENV)
    if not folder or not os.path.isdir(folder):
        return
    path = os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.checkpoint.json")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"step": step, "url": url, "time": time.time()}, f)
        os.replace(tmp, path)  # the launcher never reads half a record
    except OSError:  # the launcher's folder is gone: nothing to tell
        pass


__all__ = ["STATUS_ENV", "launched", "record_commit"]
