"""The errors a checkpoint can raise. Every message names the file involved and the fix.

Example:
    >>> try:
    ...     functrain.checkpoint.load("/no/such/dir", like=state)
    ... except functrain.checkpoint.CheckpointError as err:
    ...     print(err)
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """Base class: a checkpoint cannot be saved or loaded as asked."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """Nothing that looks like a checkpoint is at the path."""


class CheckpointNotCommittedError(CheckpointError):
    """The checkpoint has no commit marker: its save never finished."""


class CheckpointCorruptError(CheckpointError):
    """A file of the checkpoint is truncated, corrupted, missing or unsafe."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit the `like` state (keys, shapes, dtypes or kinds differ)."""
