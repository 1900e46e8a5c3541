"""What defines the training data's position, saved with it, and checked on resume.

A checkpoint's position (epoch 3, batch 35 of the epoch) only means something for the data it
was counted on: the same number of samples, batch size and data-parallel world size. Resuming
under a changed definition used to go on silently (a shrunk dataset "finished" at a batch that
does not exist, a doubled batch size ended the run an epoch early). `PositionedSource` saves
the definition next to the data's position (in `extra["data"]`) and, on resume, refuses a
change -- or, when asked (`fit(on_data_change=...)`), restarts the epoch or converts the
position by samples. A checkpoint without the record (an older one) resumes unchecked.

Example:
    >>> source = PositionedSource(loader, placement=(0, 1), on_change="error")
    >>> saved = source.state_dict(samples_in_epoch=0)
    >>> {k: saved["definition"][k] for k in ("num_samples", "batch_size", "world_size")}
    {'num_samples': 640, 'batch_size': 16, 'world_size': 1}
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.errors import CheckpointError
from ..data import DataSource, Loader
from ..units import Timestamp

__all__ = ["ON_DATA_CHANGE", "DataChangedError", "PositionedSource", "definition_of"]

ON_DATA_CHANGE = ("error", "restart_epoch", "by_samples")
_KEY = "definition"
_FIELDS = ("num_samples", "batch_size", "world_size", "batches_per_epoch")


class DataChangedError(CheckpointError):
    """The checkpoint's position was counted on other data (length, batch size, world size)."""


def definition_of(source: DataSource, world_size: int) -> dict[str, int | None]:
    """The numbers that give a position in `source` its meaning (None: not known).

    Args:
        source: `fit`'s view of the training data.
        world_size: the data-parallel world size of the state being trained.
    Returns:
        `{"num_samples", "batch_size", "world_size", "batches_per_epoch"}`; the batch size is
        the global one for a `Loader`, the per-rank one for other loaders.
    Example:
        >>> definition_of(DataSource([1, 2, 3]), 1)["batches_per_epoch"]
        3
    """
    data = source.data
    if isinstance(data, Loader):
        samples: Any = data.num_samples
        batch_size: Any = data.batch_size
        batches = data.num_batches
    else:
        batch_size = getattr(data, "batch_size", None)
        dataset = getattr(data, "dataset", None)
        try:
            samples = len(dataset) if dataset is not None else None
        except TypeError:
            samples = None
        batches = source.batches_per_epoch()
    return {
        "num_samples": samples if type(samples) is int else None,
        "batch_size": batch_size if type(batch_size) is int else None,
        "world_size": int(world_size),
        "batches_per_epoch": int(batches),
    }


def changes(saved: Any, now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{what: (saved, now)}` for each number of the position's definition that differs.

    The batch size compared is the global one (a `Loader`'s own; a per-rank loader's times the
    world size), so an elastic resume that keeps the global batch is not a change. A per-rank
    loader's length is compared on the same world size only (Streaming's is per rank).

    Example:
        >>> changes({"batch_size": 12, "world_size": 1}, {"batch_size": 24, "world_size": 1})
        {'global batch size': ('12 (12 per rank x 1 ranks)', '24 (24 per rank x 1 ranks)')}
    """
    if not isinstance(saved, dict):
        return {}
    found: dict[str, tuple[Any, Any]] = {}
    comparable = bool(saved.get("is_loader")) or saved.get("world_size") == now.get("world_size")
    for k in ("num_samples", "batches_per_epoch"):
        if k == "num_samples" and not comparable:
            continue
        if saved.get(k) is not None and now.get(k) is not None and saved[k] != now[k]:
            found[k] = (saved[k], now[k])
    before, after = _global_batch(saved), _global_batch(now)
    if before and after and before[0] != after[0]:
        found["global batch size"] = (before[1], after[1])
    return found


def _global_batch(definition: dict) -> tuple[int, str] | None:
    """`(global batch size, in words)`, or None when the batch size is not known."""
    size, world = definition.get("batch_size"), definition.get("world_size") or 1
    if not size:
        return None
    if definition.get("is_loader"):
        return size, str(size)
    return size * world, f"{size * world} ({size} per rank x {world} ranks)"


def repositioned(ts: Timestamp, how: str, saved: dict, now: dict) -> Timestamp:
    """The position `ts` (counted on the `saved` definition) on the data defined by `now`.

    The run's batch count stays (it names the checkpoints and drives the schedules); only the
    position within the epoch moves. `fit`'s horizon then counts the remaining epochs at the new
    epoch length (`horizon.max_batches_for`).

    Args:
        ts: the restored timestamp.
        how: "restart_epoch" (the epoch starts over) or "by_samples" (the first batch of the
            new data after as many samples of the epoch as were trained).
        saved, now: the definitions (see `definition_of`).
    Returns:
        the timestamp at the converted position, `batches_per_epoch` set to the new length.
    Example:
        >>> ts = Timestamp(batch=35, batch_in_epoch=35, sample_in_epoch=560)
        >>> repositioned(ts, "by_samples", {}, {"batch_size": 32, "batches_per_epoch": 10})
        ... # doctest: +SKIP
        Timestamp(epoch=1, batch=35, ...)
    """
    bpe = int(now.get("batches_per_epoch") or 0)
    bie = 0
    if how == "by_samples":
        size = now.get("batch_size")
        if size and ts.sample_in_epoch:
            # a Loader's batch size is global; a DataLoader's is per rank
            per_step = size if now.get("is_loader") else size * int(now.get("world_size") or 1)
            bie = ts.sample_in_epoch // per_step
        elif saved.get("batches_per_epoch"):
            bie = ts.batch_in_epoch * bpe // int(saved["batches_per_epoch"])
    if bpe and bie >= bpe:  # the samples trained cover the new epoch: the next one starts
        return ts.advance_epoch().replace(batches_per_epoch=bpe)
    samples = ts.sample_in_epoch if how == "by_samples" else 0
    tokens = ts.token_in_epoch if how == "by_samples" else 0
    return ts.replace(
        batch_in_epoch=bie, sample_in_epoch=samples, token_in_epoch=tokens, batches_per_epoch=bpe
    )


class PositionedSource(DataSource):
    """A `DataSource` that saves what defines its position and checks it on resume.

    Args:
        data, placement: as for `DataSource`.
        on_change: what a resume under a changed definition does: "error" (the default:
            refuse, naming both definitions), "restart_epoch" or "by_samples" (see
            `repositioned`).
    Example:
        >>> ts = source.reposition(restored.timestamp)   # after restore_latest loaded it
    """

    def __init__(self, data: Any, placement: tuple[int, int], on_change: str = "error"):
        super().__init__(data, placement=placement)
        self.world_size = placement[1]
        self.on_change = on_change
        self._pending: tuple[dict, dict] | None = None

    def definition(self) -> dict[str, Any]:
        """This data's definition (see `definition_of`)."""
        found: dict[str, Any] = dict(definition_of(self, self.world_size))
        found["is_loader"] = isinstance(self.data, Loader)
        return found

    def state_dict(self, samples_in_epoch: int) -> dict[str, Any]:
        """The data's own position state plus its definition."""
        return {**super().state_dict(samples_in_epoch), _KEY: self.definition()}

    def load_state_dict(self, saved: dict[str, Any] | None, batch_in_epoch: int) -> None:
        """Check the saved definition, then restore the position (unless it is converted).

        Raises:
            DataChangedError: the definition changed and `on_change` is "error".
        """
        if not isinstance(saved, dict):  # no record: DataSource judges what it is
            super().load_state_dict(saved, batch_in_epoch)
            return
        saved = dict(saved)
        recorded = saved.pop(_KEY, None)
        if recorded is not None and not _is_definition(recorded):
            # read from a checkpoint, so untrusted: preemption names the file and what to do
            raise ValueError(f"its data definition is not {_FIELDS} as whole numbers")
        now = self.definition()
        changed = changes(recorded, now)
        if not changed:
            super().load_state_dict(saved or None, batch_in_epoch)
            return
        if self.on_change == "error":
            details = ", ".join(f"{k}: saved {a}, now {b}" for k, (a, b) in changed.items())
            raise DataChangedError(
                f"cannot resume: the checkpoint's data position was counted on other training "
                f"data ({details}), so its position (batch {batch_in_epoch} of an epoch of "
                f"{recorded.get('batches_per_epoch')} batches) does not exist in this data. Use "
                "the same dataset and global batch size, or continue deliberately with "
                "fit(on_data_change='restart_epoch') (the interrupted epoch starts over on the "
                "new data) or fit(on_data_change='by_samples') (the position converted by the "
                "samples trained in the epoch)"
            )
        # Converted: the saved position state belongs to the old data; epoch_iter positions
        # the new data from the converted batch (a Loader directly, others by replaying).
        self._pending = (recorded, now)

    def reposition(self, ts: Timestamp) -> Timestamp:
        """`ts` converted, when `load_state_dict` decided to convert (else `ts` itself); the
        loop's state adapter writes it into the state."""
        if self._pending is None:
            return ts
        saved, now = self._pending
        self._pending = None
        return repositioned(ts, self.on_change, saved, now)


def _is_definition(value: Any) -> bool:
    return isinstance(value, dict) and all(
        value.get(k) is None or (type(value[k]) is int and value[k] >= 0) for k in _FIELDS
    )


def check_on_change(value: Any) -> str:
    """`fit(on_data_change=...)` checked.

    Example:
        >>> check_on_change("by_samples")
        'by_samples'
    """
    if value not in ON_DATA_CHANGE:
        raise ValueError(f"fit(on_data_change={value!r}): must be one of {ON_DATA_CHANGE}")
    return str(value)
