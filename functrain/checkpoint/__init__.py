"""Checkpoints: tensorstore zarr3 arrays that reload under any mesh, in orbax's layout.

- `save(path, state)` / `load(path, like=state)`: one checkpoint directory; each rank writes its
  own shards and reads only the region its `like` placements need.
- `Manager(root, every="1ep", keep_last=3, ...)`: periodic, asynchronous, atomic saves with
  retention and auto-resume, passed to `functrain.fit(..., checkpoints=manager)`.
- Storage is a path or URL: local files, `memory://`, `s3://` (any S3-compatible endpoint), `gs://`.

Example:
    >>> functrain.checkpoint.save("/tmp/ckpt", state)
    >>> state = functrain.checkpoint.load("/tmp/ckpt", like=state)
"""

from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotCommittedError,
    CheckpointNotFoundError,
)
from .manager import Manager, checkpoints, latest, retained_steps
from .reader import describe, load
from .storage import resolve
from .writer import save

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotCommittedError",
    "CheckpointNotFoundError",
    "Manager",
    "checkpoints",
    "describe",
    "latest",
    "load",
    "resolve",
    "retained_steps",
    "save",
]
