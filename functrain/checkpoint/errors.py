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
    """A file of the checkpoint is truncated, corrupted, missing or unsafe.

    Attributes:
        reason: a one-word class of damage ("chunk", "metadata", "digest", "commit", "unsafe",
            or "damaged"), used in the name auto-resume gives a checkpoint it sets aside.
    """

    def __init__(self, message: str, *, reason: str = "damaged"):
        super().__init__(message)
        self.reason = reason


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit the `like` state (keys, shapes, dtypes or kinds differ)."""


class CheckpointStorageError(CheckpointError):
    """The storage failed (unreachable, permission denied, out of space): the checkpoint itself
    may be fine, so auto-resume never sets it aside for this; retry once the storage works."""


class CheckpointLeaseError(CheckpointError):
    """Another run owns the Manager root (or took it over from this one)."""
