"""Sequence-length warm-up (Li et al., 2022): train on short sequences first.

Composer's semantics: over the first `duration` fraction of training the sequence length grows from
`min_seq_length` to `max_seq_length` in steps of `step_size`, one step every
`warmup_batches // number_of_steps` batches; afterwards it stays at `max_seq_length`. A batch is
cut to the current length by truncating every sequence tensor (`truncate=True`), or by reshaping
its tokens into more, shorter rows (`truncate=False`, which keeps every token).

Example:
    >>> batch = {"input_ids": torch.arange(8).view(1, 8), "attention_mask": torch.ones(1, 8)}
    >>> set_batch_sequence_length(batch, 4, truncate=False)["input_ids"]
    tensor([[0, 1, 2, 3],
            [4, 5, 6, 7]])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def warmup_sequence_length(
    batch_index: int,
    max_batches: int,
    duration: float = 0.3,
    min_seq_length: int = 8,
    max_seq_length: int = 1024,
    step_size: int = 8,
) -> int:
    """The sequence length to train with at batch `batch_index` of a `max_batches` run.

    Args:
        batch_index: batches trained so far.
        max_batches: the run's length in batches.
        duration: the fraction of the run spent warming up, in [0, 1].
        min_seq_length, max_seq_length: the range of lengths.
        step_size: the increment of the length.
    Returns:
        the current length, in `[min_seq_length, max_seq_length]`.
    """
    warmup_batches = int(max_batches * duration)
    if warmup_batches <= 0:
        return max_seq_length
    num_updates = (max_seq_length - min_seq_length) // step_size
    # Composer divides by these counts; one batch per update is the honest floor when they are 0.
    every = max(1, warmup_batches // max(1, num_updates))
    length = step_size * (batch_index // every) + min_seq_length
    return min(max(length, min_seq_length), max_seq_length)


def _items(batch: Any) -> list[tuple[Any, Any]]:
    if isinstance(batch, Mapping):
        return list(batch.items())
    if isinstance(batch, (tuple, list)):
        return list(enumerate(batch))
    raise TypeError(
        "set_batch_sequence_length expects a dict of tensors (Composer's convention, e.g. "
        f"{{'input_ids': ..., 'attention_mask': ...}}) or a tuple/list of tensors, got "
        f"{type(batch).__name__}"
    )


def _rebuild(batch: Any, items: list[tuple[Any, Any]]) -> Any:
    if isinstance(batch, Mapping):
        return dict(items)
    values = [v for _, v in items]
    return values if isinstance(batch, list) else type(batch)(values)


def _sequence_length(items) -> int:
    for _, value in items:
        if isinstance(value, torch.Tensor) and value.dim() > 1:
            return int(value.shape[1])
    return 0


def set_batch_sequence_length(
    batch: Any,
    curr_seq_len: int,
    truncate: bool = True,
    preserve_end_of_sequence: bool = False,
) -> Any:
    """A batch whose sequence tensors have length `curr_seq_len` (dimension 1).

    Args:
        batch: a dict of `(N, T, ...)` tensors (or a tuple/list of them). A batch already at most
            `curr_seq_len` long is returned unchanged.
        curr_seq_len: the new length.
        truncate: keep the first `curr_seq_len` positions (True), or reshape all tokens into rows
            of `curr_seq_len`, dropping the remainder (False; needs `input_ids` in a dict batch
            and every tensor of `input_ids`'s shape).
        preserve_end_of_sequence: when truncating, copy each row's last real token (found from
            `attention_mask`) into the last kept position.
    Returns:
        a new batch (the input is not modified).
    """
    if curr_seq_len < 1:
        raise ValueError(f"curr_seq_len must be >= 1, got {curr_seq_len}")
    items = _items(batch)
    if curr_seq_len >= _sequence_length(items):
        return batch
    if truncate:
        for key, value in items:
            if not isinstance(value, torch.Tensor) or value.dim() < 2:
                raise ValueError(
                    "sequence-length warm-up with truncate=True needs every batch tensor to be "
                    f"sequence-shaped (N, T, ...); {key!r} has shape "
                    f"{tuple(getattr(value, 'shape', ()))}"
                )
        if preserve_end_of_sequence:
            mapping = dict(items)
            if "attention_mask" not in mapping:
                raise ValueError(
                    "preserve_end_of_sequence=True needs an 'attention_mask' in the batch"
                )
            mask = mapping["attention_mask"]
            rows = torch.arange(mask.shape[0], device=mask.device)
            eos = mask.sum(dim=1).long() - 1
            eos_cut = eos.clamp(max=curr_seq_len - 1)
            new_items = []
            for key, value in items:
                cut = value[:, :curr_seq_len].clone()
                cut[rows, eos_cut] = value[rows, eos]
                new_items.append((key, cut))
            return _rebuild(batch, new_items)
        return _rebuild(batch, [(k, v[:, :curr_seq_len].contiguous()) for k, v in items])

    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ValueError(
                "sequence-length warm-up with truncate=False needs 'input_ids' in the batch"
            )
        shape = batch["input_ids"].shape
    else:
        shape = items[0][1].shape
    total = (int(torch.Size(shape).numel()) // curr_seq_len) * curr_seq_len
    new_items = []
    for key, value in items:
        if not isinstance(value, torch.Tensor) or value.shape != shape:
            raise ValueError(
                "with truncate=False every batch tensor must have the shape of the token ids "
                f"{tuple(shape)}; {key!r} has {tuple(getattr(value, 'shape', ()))}"
            )
        new_items.append((key, value.reshape(-1)[:total].view(-1, curr_seq_len)))
    return _rebuild(batch, new_items)
