"""The order of an epoch and each rank's share of it: pure functions of `(seed, epoch)`.

`epoch_order` permutes the dataset's indices with a counter-based key, `rank_slice` cuts a global
batch into the ranks' parts, and `ResumableBatchSampler` yields this rank's part of every global
batch from any position, loading nothing to get there.

Example:
    >>> sampler = ResumableBatchSampler(10, batch_size=4, seed=0, rank=1, world_size=2)
    >>> sampler.set_position(epoch=3, start_batch=1)
    >>> [len(b) for b in sampler]
    [2]
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from ..rng import RngState, seed_for


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
