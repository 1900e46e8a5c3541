"""`Loader`: a resumable, world-size-independent loader over a map-style dataset.

Example:
    >>> loader = Loader(torch.utils.data.TensorDataset(x, y), batch_size=256, seed=0)
    >>> for batch in loader.epoch_iter(epoch=2, start_batch=17):  # resumes in O(1)
    ...     ...
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..rng import RngState, seed_for
from .order import ResumableBatchSampler


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
