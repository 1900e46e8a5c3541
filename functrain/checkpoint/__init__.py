"""Checkpoints: tensorstore zarr3 arrays that reload under any mesh, in orbax's layout.

- `save(path, state)` / `load(path, like=state)`: one checkpoint directory; each rank writes its
  own shards and reads only the region its `like` placements need.
- `Manager(root, every="1ep", keep_last=3, ...)`: periodic, asynchronous, atomic saves with
  retention and auto-resume, passed to `functrain.fit(..., checkpoints=manager)`.
- Storage is a path or URL: local files, `memory://`, `s3://` (any S3-compatible endpoint), `gs://`.
- Checkpoints are untrusted input: every metadata file is validated and digest-checked before
  anything is allocated, nothing outside a checkpoint is followed, and one run owns a Manager
  root at a time (a lease). docs/checkpoints.md says what is guaranteed.

Everything but the errors is imported when first read (`functrain.checkpoint.Manager`): the
format needs tensorstore and ml_dtypes, ~0.6 s to import, which a run that never checkpoints
should not pay (see `functrain._lazy`).

Example:
    >>> functrain.checkpoint.save("/tmp/ckpt", state)
    >>> state = functrain.checkpoint.load("/tmp/ckpt", like=state)
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointLeaseError,
    CheckpointMismatchError,
    CheckpointNotCommittedError,
    CheckpointNotFoundError,
    CheckpointStorageError,
)

if TYPE_CHECKING:
    from .description import describe
    from .manager import Manager
    from .reader import load
    from .retention import retained_steps
    from .root import checkpoints, latest
    from .storage import resolve
    from .writer import save

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Manager": ".manager",
        "checkpoints": ".root",
        "latest": ".root",
        "retained_steps": ".retention",
        "describe": ".description",
        "load": ".reader",
        "resolve": ".storage",
        "save": ".writer",
    },
)

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointLeaseError",
    "CheckpointMismatchError",
    "CheckpointNotCommittedError",
    "CheckpointNotFoundError",
    "CheckpointStorageError",
    "Manager",
    "checkpoints",
    "describe",
    "latest",
    "load",
    "resolve",
    "retained_steps",
    "save",
]
