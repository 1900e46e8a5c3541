"""Deterministic, world-size-independent, O(1)-resumable batches.

The order of an epoch is a pure function of `(seed, epoch)`: a permutation of the dataset's
indices drawn from a counter-based key (`order.py`). Global batch `b` is the slice
`[b*B, (b+1)*B)` of that permutation, whatever the number of processes, and rank `r` of `W` takes
the `r`-th of `W` equal parts of it. Concatenating the ranks' batches in rank order therefore
gives the global batch, so N ranks see exactly what one rank sees, and resuming at batch `b` of
epoch `e` means starting the index slicing at `b`: no sample is loaded or skipped over (Composer
replays the loader instead).

`Loader` (`loader.py`) wraps any map-style `torch.utils.data.Dataset` in a
`torch.utils.data.DataLoader` driven by that batch order (workers, pin_memory, collate_fn all work
as usual). `DataSource` (`source.py`) adapts what `fit` is given: a `Loader` (exact O(1) resume),
an iterable with `state_dict`/`load_state_dict` (resumes through it, like torchdata's
StatefulDataLoader or MosaicML's StreamingDataset), or any other re-iterable (the fallback: batches
before the resume point are replayed and dropped). `num_samples` (`batches.py`) counts a batch's
samples.

Example:
    >>> ds = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10))
    >>> loader = Loader(ds, batch_size=4, seed=0, rank=0, world_size=1)
    >>> len(loader)
    2
    >>> x, y = next(iter(loader.epoch_iter(epoch=1, start_batch=1)))  # O(1): nothing replayed
"""

from .batches import num_samples
from .loader import Loader, place
from .order import ResumableBatchSampler, epoch_order, rank_slice
from .source import DataSource

__all__ = [
    "DataSource",
    "Loader",
    "ResumableBatchSampler",
    "epoch_order",
    "num_samples",
    "place",
    "rank_slice",
]
