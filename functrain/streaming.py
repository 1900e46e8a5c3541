"""MosaicML Streaming as `fit`'s training data: MDS shards from a directory or an object store,
each rank reading its own part, resumed exactly through the dataset's own state (nothing replayed).

`StreamingData(dataset)` wraps a `streaming.StreamingDataset` in a `DataLoader` and gives `fit`
what it resumes through: `set_epoch` (fit's epoch becomes the dataset's, so the shuffle of epoch
`e` is Streaming's epoch `e` even after a restart at an epoch boundary) and
`state_dict(num_samples, from_beginning)` / `load_state_dict(state)`, Streaming's own resume
state (`epoch`, `sample_in_epoch`, `num_canonical_nodes`, `shuffle_seed`,
`initial_physical_nodes`). Streaming splits each epoch between the ranks it finds in the
launcher's environment (`RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`), so the same script runs on one
process and under `python -m functrain.launch -n N`. What resumes exactly, and what Streaming's
elasticity rules allow across rank counts, is measured in docs/streaming.md.

Streaming is an optional extra; it installs without its pinned dependencies (it caps numpy below
2.2 and transformers below 5, which functrain's other extras need, and requires torchvision, whose
PyPI builds break a CPU torch; see `import_streaming`):

    pip install -e ".[streaming]" && pip install --no-deps "mosaicml-streaming==0.13.0"

Example:
    >>> streaming = import_streaming()
    >>> dataset = streaming.StreamingDataset(remote="s3://bucket/digits", local="/tmp/cache",
    ...                            batch_size=32, shuffle=True, shuffle_seed=0)  # per-rank batch
    >>> data = StreamingData(dataset, columns=("x", "y"))   # batches are (x, y) tuples
    >>> state = functrain.fit(step, state, data, duration="2ep", checkpoints=manager,
    ...                       autoresume=True)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

INSTALL_COMMAND = (
    'pip install -e ".[streaming]" && pip install --no-deps "mosaicml-streaming==0.13.0"'
)
STATE_KEYS = (
    "epoch",
    "sample_in_epoch",
    "num_canonical_nodes",
    "shuffle_seed",
    "initial_physical_nodes",
)

# A torch.library.Library un-registers its definitions when collected, so it is kept here. It is
# the one process-wide effect of this module, and only when torchvision's ops failed to load.
_TORCHVISION_SCHEMAS: list[Any] = []


def import_streaming() -> Any:
    """Import MosaicML Streaming, or raise an ImportError naming the install command.

    `import streaming` runs its package `__init__`, which imports its vision datasets and so
    torchvision. functrain does not install torchvision: PyPI's wheels are CUDA builds whose C++
    ops do not load beside a CPU torch ("operator torchvision::nms does not exist"), and once
    installed they also break `import transformers`. Without torchvision, the package is set up
    from `streaming.base` (everything `fit` needs: `StreamingDataset`, `Stream`, `MDSWriter`,
    the other writers, `StreamingDataLoader`), leaving out `streaming.vision`'s dataset classes.
    With torchvision installed the package imports whole (the two op schemas torchvision
    registers kernels for, `nms` and `qnms`, are defined first when its ops fail to load).

    Call it (or import `functrain.streaming` and call it) before `import streaming`.

    Returns:
        the `streaming` module.
    """
    try:
        if "streaming" in sys.modules or importlib.util.find_spec("torchvision") is not None:
            _import_torchvision()
            import streaming
        else:
            streaming = _import_streaming_base()
    except ImportError as error:
        raise ImportError(
            f"functrain.streaming needs MosaicML Streaming ({error}); install it with:\n"
            f"    {INSTALL_COMMAND}"
        ) from error
    return streaming


def _import_torchvision() -> None:
    """Import torchvision if installed, defining its missing op schemas when its ops fail."""
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        if "torchvision::" not in str(error) or "does not exist" not in str(error):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the failed, half-initialised import
        library = torch.library.Library("torchvision", "DEF")  # noqa: TOR901
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _TORCHVISION_SCHEMAS.append(library)
        import torchvision  # noqa: F401


def _import_streaming_base() -> Any:
    """The `streaming` package with `streaming.base`'s names, its `__init__` not run."""
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("No module named 'streaming'")
    package = importlib.util.module_from_spec(spec)
    sys.modules["streaming"] = package  # what `import streaming.base` needs as its parent
    try:
        base = importlib.import_module("streaming.base")
        package.__version__ = importlib.import_module("streaming._version").__version__
    except BaseException:
        sys.modules.pop("streaming", None)
        raise
    for name in base.__all__:
        setattr(package, name, getattr(base, name))
    package.base = base
    return package


def collate_samples(samples: list[dict[str, Any]], columns: Sequence[str] | None = None) -> Any:
    """Stack Streaming's samples (dicts of numpy arrays and scalars) into one batch of tensors.

    Args:
        samples: the samples of one batch.
        columns: the column names to return, in order, as a tuple; None: the dict of every column.
    Returns:
        `{column: tensor}`, or a tuple of tensors in the order of `columns`.
    """
    if columns is not None:
        missing = [c for c in columns if c not in samples[0]]
        if missing:
            raise KeyError(
                f"columns {missing} are not in the dataset's samples (it has {sorted(samples[0])})"
            )
        samples = [{c: s[c] for c in columns} for s in samples]
    # MDS arrays are read-only views of the shard; torch warns on those, so they are copied.
    writable = [
        {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in s.items()} for s in samples
    ]
    batch = default_collate(writable)
    return tuple(batch[c] for c in columns) if columns is not None else batch


class _Collate:
    """`collate_samples` with fixed columns, as a picklable object (DataLoader workers)."""

    def __init__(self, columns: Sequence[str] | None):
        self.columns = tuple(columns) if columns is not None else None

    def __call__(self, samples: list[dict[str, Any]]) -> Any:
        return collate_samples(samples, self.columns)


class StreamingData:
    """A `streaming.StreamingDataset` as `fit`'s training data, resumable exactly.

    Args:
        dataset: a `StreamingDataset` built with this rank's `batch_size` (Streaming's batch is
            per device: the global batch is `batch_size * world_size`), created on every rank.
        columns: return each batch as a tuple of these columns (e.g. `("x", "y")`); None: the
            dict of every column.
        collate_fn: how samples become a batch (default: `collate_samples` with `columns`).
        num_workers, pin_memory, prefetch_factor, persistent_workers: passed to the
            `DataLoader`; Streaming splits each rank's samples between the workers, so the order
            depends on `num_workers` (keep it fixed across a resume).
    Raises:
        ValueError: when the dataset has no `batch_size`.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        columns: Sequence[str] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ):
        for method in ("state_dict", "load_state_dict"):
            if not callable(getattr(dataset, method, None)):
                raise TypeError(
                    f"StreamingData wraps a streaming.StreamingDataset; {type(dataset).__name__} "
                    f"has no {method}()"
                )
        batch_size = getattr(dataset, "batch_size", None)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(
                "the StreamingDataset needs batch_size= (the per-rank batch size): Streaming "
                "partitions each epoch by it, and resumes only with it; e.g. "
                "StreamingDataset(..., batch_size=global_batch_size // world_size)"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            collate_fn=collate_fn if collate_fn is not None else _Collate(columns),
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
        )
        self._epoch = 0
        self._pending: dict[str, Any] | None = None

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration Streaming's epoch `epoch` (called by `fit` before each epoch)."""
        self._epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        position, self._pending = self._pending, None
        if position is None and self._epoch != int(self.dataset.next_epoch):
            # A restart at an epoch boundary (or a jump of `set_epoch`): Streaming would count its
            # epochs from 0 again, so the position is written to make its epoch fit's.
            position = {"epoch": self._epoch, "sample_in_epoch": 0}
        if position is not None:
            if position["epoch"] != self._epoch:
                raise ValueError(
                    f"the saved Streaming position is in epoch {position['epoch']}, but training "
                    f"resumes epoch {self._epoch}; resume with the checkpoint it was saved with"
                )
            self._write_position(position)
        return iter(self.loader)

    def _write_position(self, position: dict[str, Any]) -> None:
        """Give Streaming its resume position: written once per node, read by every rank.

        Streaming keeps the position in shared memory that its ranks (and workers) read when an
        epoch starts; a rank that read it while another was writing would see a blank block, so
        only the node's first rank writes it, and the ranks wait for each other.
        """
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            current = self.dataset.state_dict(0, True)  # its canonical nodes, seed, first nodes
            self.dataset.load_state_dict({**current, **position})
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def state_dict(self, num_samples: int, from_beginning: bool = True) -> dict[str, Any]:
        """Streaming's resume state after `num_samples` samples (all ranks) of the current epoch.

        Args:
            num_samples: the global samples trained on in this epoch.
            from_beginning: `num_samples` counts from the epoch's start (fit's count); False
                adds them to the sample this process resumed at, as Streaming's own loader does.
        Returns:
            a JSON-able dict with Streaming's keys (`STATE_KEYS`).
        """
        state = dict(self.dataset.state_dict(int(num_samples), bool(from_beginning)))
        state["epoch"] = self._epoch
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict`'s result at the next iteration (no sample is replayed)."""
        if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
            raise ValueError(
                f"a Streaming resume state needs the keys {list(STATE_KEYS)}; got "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        for key in ("epoch", "sample_in_epoch", "num_canonical_nodes"):
            if not isinstance(state[key], int) or state[key] < 0:
                raise ValueError(
                    f"Streaming resume state: {key} must be an int >= 0, got {state[key]!r}"
                )
        self._pending = {k: state[k] for k in STATE_KEYS}


__all__ = ["INSTALL_COMMAND", "StreamingData", "collate_samples", "import_streaming"]
