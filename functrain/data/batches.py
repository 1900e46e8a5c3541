"""What a batch is, and how many samples it holds.

A batch is any pytree whose tensor leaves share a leading (sample) dimension: a tensor, a tuple
`(inputs, targets)`, a dict of tensors, ... Scalars and 0-d tensors ride along unbatched.

Example:
    >>> num_samples({"x": torch.zeros(4, 3), "lr": 0.1})
    4
"""

from __future__ import annotations

from typing import Any

import torch

from ..tree import tree_leaves


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
