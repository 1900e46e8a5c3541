"""Checkpoints: tensorstore zarr3 arrays that reload under any mesh, in orbax's layout.

- `save(path, state)` / `load(path, like=state)`: one checkpoint directory; each rank writes its
  own shards and reads only the region its `like` placements need.
- `Manager(root, every="1ep", keep_last=3, ...)`: periodic, asynchronous, atomic saves with
  retention and auto-resume, passed to `functrain.fit(..., checkpoints=manager)`.
- Storage is a path or URL: local files, `memory://`, `s3://` (any S3-compatible endpoint), `gs://`.
- Checkpoints are untrusted input: every metadata file is validated and digest-checked before
  anything is allocated, nothing outside a checkpoint is followed, and one run owns a Manager
  root at a time (a lease). docs/checkpoints.md says what is guaranteed.

Example:
    >>> functrain.checkpoint.save("/tmp/ckpt", state)
    >>> state = functrain.checkpoint.load("/tmp/ckpt", like=state)
"""

from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointLeaseError,
    CheckpointMismatchError,
    CheckpointNotCommittedError,
    CheckpointNotFoundError,
    CheckpointStorageError,
)
from .manager import Manager, checkpoints, latest, retained_steps
from .reader import describe, load
from .storage import resolve
from .writer import save

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
