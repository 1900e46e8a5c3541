"""`DataSource`: `fit`'s view of whatever training data it is given, and how it resumes.

Example:
    >>> source = DataSource(loader, placement=(0, 1))
    >>> batches = source.epoch_iter(epoch=2, start_batch=17)
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from typing import Any

from .loader import Loader, place


class DataSource:
    """`fit`'s view of its training data: batches per epoch, positioned iteration, resume state.

    Args:
        data: a `Loader` (exact O(1) resume), an iterable with `state_dict()` and
            `load_state_dict(d)` (or a loader whose `.dataset` has MosaicML StreamingDataset's
            `state_dict(num_samples, from_beginning)`), or any re-iterable of batches (resume
            replays and drops the batches before the resume point).
        placement: `(dp_rank, dp_size)` of the state being trained; a `Loader` built without
            its own rank and world size takes them (see `place`).
    """

    def __init__(self, data: Any, placement: tuple[int, int] | None = None):
        if isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
            raise TypeError(
                "train_data must be a functrain.data.Loader, a DataLoader or another re-iterable "
                f"of batches; got {type(data).__name__}"
            )
        self.data = data if placement is None else place(data, *placement)
        self._loaded_state = False
        self._warned = False

    @property
    def kind(self) -> str:
        """ "loader" (O(1) resume), "stateful" (resumes by state_dict) or "replay"."""
        if isinstance(self.data, Loader):
            return "loader"
        if self._stateful_object() is not None:
            return "stateful"
        return "replay"

    def _stateful_object(self) -> Any:
        if hasattr(self.data, "state_dict") and hasattr(self.data, "load_state_dict"):
            return self.data
        dataset = getattr(self.data, "dataset", None)
        if hasattr(dataset, "state_dict") and hasattr(dataset, "load_state_dict"):
            return dataset
        return None

    def batches_per_epoch(self) -> int:
        """Batches per epoch on this rank (0 when the data has no length)."""
        try:
            return int(len(self.data))
        except TypeError:
            return 0

    def state_dict(self, samples_in_epoch: int) -> dict[str, Any]:
        """What to save with a checkpoint (JSON-able), given the global samples seen this epoch."""
        if isinstance(self.data, Loader):
            return self.data.fingerprint()
        target = self._stateful_object()
        if target is None:
            return {}
        params = inspect.signature(target.state_dict).parameters
        if "num_samples" in params:  # StreamingDataset: the position is given by the trainer
            # from_beginning=True: fit counts from the epoch's start, not from the resume point
            # (False would add the resumed offset twice after a mid-epoch resume).
            return {"state": target.state_dict(samples_in_epoch, True)}
        return {"state": target.state_dict()}

    def load_state_dict(self, saved: dict[str, Any] | None, batch_in_epoch: int) -> None:
        """Restore the position saved by `state_dict` (before the first `epoch_iter`)."""
        if not saved or batch_in_epoch == 0:
            return
        if isinstance(self.data, Loader):
            mine = self.data.fingerprint()
            changed = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
            if changed:
                details = ", ".join(f"{k}: saved {a}, now {b}" for k, (a, b) in changed.items())
                raise ValueError(
                    f"cannot resume mid-epoch (batch {batch_in_epoch}): the training data changed "
                    f"({details}), so the rest of the epoch would not be the same samples; use the "
                    "same dataset, global batch_size and seed as the checkpointed run"
                )
            return
        target = self._stateful_object()
        if target is not None and "state" in saved:
            target.load_state_dict(saved["state"])
            self._loaded_state = True

    def epoch_iter(self, epoch: int, start_batch: int) -> Iterator[Any]:
        """This rank's batches of `epoch` from `start_batch` on."""
        if isinstance(self.data, Loader):
            return self.data.epoch_iter(epoch, start_batch)
        for holder in (
            self.data,
            getattr(self.data, "sampler", None),
            getattr(self.data, "batch_sampler", None),
        ):
            set_epoch = getattr(holder, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
                break
        iterator = iter(self.data)
        if self._loaded_state:  # the iterable positioned itself from its state_dict
            self._loaded_state = False
            return iterator
        if start_batch:
            if not self._warned:
                warnings.warn(
                    f"resuming {type(self.data).__name__} at batch {start_batch} of epoch {epoch} "
                    "by replaying and dropping the earlier batches (it has no state_dict); use "
                    "functrain.data.Loader for an O(1) resume",
                    stacklevel=3,
                )
                self._warned = True
            for _ in range(start_batch):
                next(iterator, None)
        return iterator
