"""Deterministic, world-size-independent, O(1)-resumable batches.

The order of an epoch is a pure function of `(seed, epoch)`: a permutation of the dataset's
indices drawn from a counter-based key. Global batch `b` is the slice `[b*B, (b+1)*B)` of that
permutation, whatever the number of processes, and rank `r` of `W` takes the `r`-th of `W` equal
parts of it. Concatenating the ranks' batches in rank order therefore gives the global batch, so
N ranks see exactly what one rank sees, and resuming at batch `b` of epoch `e` means starting the
index slicing at `b`: no sample is loaded or skipped over (Composer replays the loader instead).

`Loader` wraps any map-style `torch.utils.data.Dataset` in a `torch.utils.data.DataLoader` driven
by that batch order (workers, pin_memory, collate_fn all work as usual). `DataSource` adapts what
`fit` is given: a `Loader` (exact O(1) resume), an iterable with `state_dict`/`load_state_dict`
(resumes through it, like torchdata's StatefulDataLoader or MosaicML's StreamingDataset), or any
other re-iterable (the fallback: batches before the resume point are replayed and dropped).

Example:
    >>> ds = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10))
    >>> loader = Loader(ds, batch_size=4, seed=0, rank=0, world_size=1)
    >>> len(loader)
    2
    >>> x, y = next(iter(loader.epoch_iter(epoch=1, start_batch=1)))  # O(1): nothing replayed
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from .rng import RngState, seed_for
from .tree import tree_leaves


def num_samples(batch: Any) -> int:
    """The samples in a batch: the leading dimension of its first tensor leaf that has one.

    The one count of a batch's samples: the step splits microbatches and counts
    `metrics["samples"]` with it, and the data algorithms check that inputs and targets agree.

    Args:
        batch: a tensor or any pytree of tensors (scalars and 0-d tensors are skipped).
    Returns:
        the size of the first batched tensor's leading dimension.
    Raises:
        ValueError: when no leaf has a batch dimension.
    Example:
        >>> num_samples((0.5, torch.zeros(3, 2), torch.zeros(7)))
        3
    """
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    raise ValueError(
        "the batch has no tensor with a batch dimension; a batch must be a tensor or a "
        f"tuple/dict of tensors sharing their first dimension, got {type(batch).__name__}"
    )


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The order of the dataset's indices in `epoch`, a pure function of `(seed, epoch)`.

    Args:
        num_samples: the dataset's length.
        seed: the data seed.
        epoch: the epoch number.
        shuffle: False gives `0, 1, ..., n-1` every epoch.
    Returns:
        an int64 tensor, a permutation of `range(num_samples)`.
    Example:
        >>> bool((epoch_order(5, seed=0, epoch=3) == epoch_order(5, seed=0, epoch=3)).all())
        True
    """
    if not shuffle:
        return torch.arange(num_samples, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed_for(RngState(seed=int(seed)), epoch, "data.order"))
    return torch.randperm(num_samples, generator=gen, dtype=torch.int64)


def rank_slice(indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s part of one global batch: the `rank`-th of `world_size` near-equal parts.

    Concatenating every rank's part in rank order gives `indices` back.
    """
    return torch.tensor_split(indices, world_size)[rank]


class ResumableBatchSampler(Sampler):
    """A batch sampler over this rank's slice of every global batch, starting anywhere.

    `set_position(epoch, start_batch)` chooses where the next iteration starts; positioning costs
    one permutation of the indices (microseconds per million samples) and loads nothing.

    Args:
        num_samples: the dataset's length.
        batch_size: the GLOBAL batch size (all ranks together).
        shuffle, seed, drop_last: as in `Loader`.
        rank, world_size: this process's data-parallel rank and the number of ranks.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.epoch = 0
        self.start_batch = 0

    @property
    def num_batches(self) -> int:
        """Global batches per epoch."""
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_position(self, epoch: int, start_batch: int = 0) -> None:
        """Make the next iteration yield epoch `epoch` from global batch `start_batch` on."""
        if not 0 <= start_batch <= self.num_batches:
            raise ValueError(
                f"start_batch must be in [0, {self.num_batches}] (batches per epoch), "
                f"got {start_batch}"
            )
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def global_batch(self, epoch: int, batch: int) -> torch.Tensor:
        """The dataset indices of global batch `batch` of `epoch` (all ranks)."""
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        return order[batch * self.batch_size : (batch + 1) * self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        for batch in range(self.start_batch, self.num_batches):
            indices = order[batch * self.batch_size : (batch + 1) * self.batch_size]
            local = rank_slice(indices, self.rank, self.world_size)
            if len(local):  # only the last partial batch of drop_last=False can leave a rank empty
                yield local.tolist()

    def __len__(self) -> int:
        return sum(1 for _ in self._local_sizes(self.start_batch))

    def _local_sizes(self, start: int) -> Iterator[int]:
        for batch in range(start, self.num_batches):
            size = min(self.batch_size, self.num_samples - batch * self.batch_size)
            base, extra = divmod(size, self.world_size)
            local = base + (1 if self.rank < extra else 0)
            if local:
                yield local


class Loader:
    """A resumable, world-size-independent data loader over a map-style dataset.

    Args:
        dataset: any map-style `torch.utils.data.Dataset` (`__len__` and `__getitem__`).
        batch_size: the GLOBAL batch size; each of the `world_size` ranks gets
            `batch_size // world_size` samples of every batch.
        shuffle: shuffle each epoch (the order is a pure function of `(seed, epoch)`).
        seed: the data seed.
        drop_last: drop the last incomplete batch (keep True for training on several ranks).
        num_workers, pin_memory, collate_fn: passed to `torch.utils.data.DataLoader`.
        multiprocessing_context: how workers start ("fork", "spawn", "forkserver"; None: the
            platform default). Use "spawn" when threads already run in the process (JAX, gRPC),
            since forking a multithreaded process can deadlock.
        rank, world_size: this process's data-parallel rank and their number. Left out, `fit`,
            `evaluate` and `predict` place the loader by their state's layout
            (`functrain.parallel.data_parallel_info(state.layout)`); iterated by hand in a
            process of a larger world, give them (a one-process world needs neither).

    Randomness inside the dataset (augmentations in `__getitem__`): DataLoader worker seeds are
    a function of `(seed, epoch, start batch, rank)`, so a run is reproducible; for a resumed run
    to draw exactly what the uninterrupted one drew, seed such randomness from the sample index
    (or move it into the step, as functrain's data algorithms do).
    Example:
        >>> loader = Loader(dataset, batch_size=256, seed=0)
        >>> for batch in loader.epoch_iter(epoch=2, start_batch=17):  # resumes in O(1)
        ...     ...
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
        collate_fn: Callable[[list], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        multiprocessing_context: str | None = None,
    ):
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(
                "Loader needs a map-style dataset (with __len__ and __getitem__), got "
                f"{type(dataset).__name__}; pass an iterable dataset to functrain.fit directly "
                "(it resumes through its state_dict if it has one)"
            )
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        num_samples = len(dataset)
        if num_samples == 0:
            raise ValueError("the dataset is empty (len 0): there is nothing to load")
        if drop_last and num_samples < batch_size:
            raise ValueError(
                f"the dataset has {num_samples} samples, fewer than batch_size={batch_size} with "
                "drop_last=True, so an epoch would have no batch; lower batch_size or pass "
                "drop_last=False"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.multiprocessing_context = multiprocessing_context
        self._rank, self._world_size = rank, world_size
        self.epoch = 0
        self._sampler: ResumableBatchSampler | None = None

    # -- placement ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's data-parallel rank."""
        return self._placement()[0]

    @property
    def world_size(self) -> int:
        """The number of data-parallel ranks sharing each global batch."""
        return self._placement()[1]

    @property
    def placed_explicitly(self) -> bool:
        """True when `rank` and `world_size` were given (not left to `fit`/`evaluate`)."""
        return self._rank is not None and self._world_size is not None

    def placed(self, rank: int, world_size: int) -> Loader:
        """This loader with its rank and world size set (a copy; this one is unchanged).

        `fit` calls it with the state's data-parallel coordinates when the loader was built
        without them. A loader given its own `rank=`/`world_size=` keeps them.

        Example:
            >>> loader.placed(*functrain.parallel.data_parallel_info(state.layout))
        """
        if self.placed_explicitly:
            return self
        other = copy.copy(self)
        other._rank, other._world_size = int(rank), int(world_size)
        other._sampler = None
        return other

    def _placement(self) -> tuple[int, int]:
        rank, world = self._rank, self._world_size
        if rank is None or world is None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                raise ValueError(
                    f"this Loader has no rank/world_size and the process is one of "
                    f"{dist.get_world_size()} ranks, so which slice of each batch is this rank's "
                    "is unknown; pass it to fit/evaluate (which place it by the state's layout), "
                    "or build it with Loader(..., rank=r, world_size=n) from "
                    "functrain.parallel.data_parallel_info(state.layout)"
                )
            rank = 0 if rank is None else rank
            world = 1 if world is None else world
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, world_size={world}), got {rank}")
        if self.batch_size % world:
            raise ValueError(
                f"the global batch_size={self.batch_size} is not divisible by world_size={world}: "
                "each rank takes an equal slice of every global batch; pick a batch size that "
                "is a multiple of the number of data-parallel ranks"
            )
        return rank, world

    def sampler(self) -> ResumableBatchSampler:
        """The batch sampler (this rank's indices), built on first use."""
        rank, world = self._placement()
        if self._sampler is None or (self._sampler.rank, self._sampler.world_size) != (rank, world):
            self._sampler = ResumableBatchSampler(
                len(self.dataset),
                self.batch_size,
                shuffle=self.shuffle,
                seed=self.seed,
                drop_last=self.drop_last,
                rank=rank,
                world_size=world,
            )
        return self._sampler

    # -- iteration ---------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """The dataset's length."""
        return len(self.dataset)

    @property
    def num_batches(self) -> int:
        """Global batches per epoch (the same on every rank)."""
        return self.sampler().num_batches

    @property
    def local_batch_size(self) -> int:
        """Samples per full batch on this rank."""
        return self.batch_size // self.world_size

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        sampler = self.sampler()
        return sum(1 for _ in sampler._local_sizes(0))

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch that plain `iter(loader)` yields (like DistributedSampler)."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        return self.epoch_iter(self.epoch)

    def epoch_iter(self, epoch: int, start_batch: int = 0) -> Iterator[Any]:
        """This rank's batches of `epoch`, from global batch `start_batch` on; O(1) to position.

        Args:
            epoch: the epoch (its order is a pure function of `(seed, epoch)`).
            start_batch: the first global batch to yield, in `[0, num_batches]`.
        Returns:
            an iterator of collated batches.
        """
        # A fresh sampler per call, so two iterators never share a position.
        sampler = copy.copy(self.sampler())
        sampler.set_position(epoch, start_batch)
        if self._fast_path():
            return self._index_tensors(sampler)
        # A per-position generator makes worker seeds a function of (seed, epoch, start, rank).
        gen = torch.Generator().manual_seed(
            seed_for(
                RngState(seed=self.seed), epoch, "data.workers", start_batch * 65536 + sampler.rank
            )
        )
        kwargs: dict[str, Any] = {}
        if self.collate_fn is not None:
            kwargs["collate_fn"] = self.collate_fn
        if self.num_workers and self.multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = self.multiprocessing_context
        return iter(
            DataLoader(
                self.dataset,
                batch_sampler=sampler,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                generator=gen,
                **kwargs,
            )
        )

    def _fast_path(self) -> bool:
        # In-memory tensors: index them directly (same values as default_collate, far faster).
        return (
            isinstance(self.dataset, TensorDataset)
            and self.collate_fn is None
            and self.num_workers == 0
        )

    def _index_tensors(self, sampler: ResumableBatchSampler) -> Iterator[tuple[torch.Tensor, ...]]:
        pin = self.pin_memory and torch.cuda.is_available()
        dataset = self.dataset
        assert isinstance(dataset, TensorDataset)  # `_fast_path` chose this path
        for indices in sampler:
            index = torch.as_tensor(indices, dtype=torch.int64)
            batch = tuple(t[index] for t in dataset.tensors)
            yield tuple(t.pin_memory() for t in batch) if pin else batch

    def fingerprint(self) -> dict[str, int]:
        """What must match for a mid-epoch resume to continue the same order (saved by `fit`)."""
        return {
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": int(self.shuffle),
            "drop_last": int(self.drop_last),
        }


def place(data: Any, rank: int, world_size: int) -> Any:
    """`data` placed on data-parallel rank `rank` of `world_size` when it is a `Loader` built
    without its own placement (a copy); any other data unchanged (it shards itself).

    Example:
        >>> for batch in place(loader, *functrain.parallel.data_parallel_info(state.layout)):
        ...     ...
    """
    return data.placed(rank, world_size) if isinstance(data, Loader) else data


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
