"""Sequence-length warm-up as a step transform (Composer's `SeqLengthWarmup`).

At each step the length is `warmup_sequence_length(state.timestamp.batch, max_batches, ...)`:
from `min_seq_length` up to `max_seq_length` in steps of `step_size` over the first `duration` of
the run (`fit` sets the run's length), and every sequence tensor of the batch is truncated (or,
with `truncate=False`, reshaped into more, shorter rows) to it. Batches are dicts such as
`{"input_ids": ..., "attention_mask": ..., "labels": ...}` (Composer's convention) or tuples of
sequence tensors.

Composer also runs one forward/backward pass at full length before training to reserve memory;
a functional step has no such side effect, so the first full-length step does that allocation.

Order: list it first among the data transforms (the others see the short batch).

Example:
    >>> step = functrain.compose(step, seq_length_warmup(duration=0.3, max_seq_length=1024))
"""

from __future__ import annotations

from ..functional.seq_length_warmup import set_batch_sequence_length, warmup_sequence_length
from ..step import Algorithm
from .batch_transform import batch_algorithm


def seq_length_warmup(
    duration: float = 0.3,
    min_seq_length: int = 8,
    max_seq_length: int = 1024,
    step_size: int = 8,
    truncate: bool = True,
    preserve_end_of_sequence: bool = False,
) -> Algorithm:
    """Warm the sequence length up from `min_seq_length` to `max_seq_length`.

    Args:
        duration: fraction of the run spent warming up, in [0, 1]. Default 0.3.
        min_seq_length: the first length, >= 1. Default 8.
        max_seq_length: the final length. Default 1024.
        step_size: the length increment, >= 1. Default 8.
        truncate: truncate sequences (True) or reshape extra tokens into new rows (False).
        preserve_end_of_sequence: keep each row's last real token when truncating.
    Returns:
        the `Algorithm` "seq_length_warmup" (stateless, exactly resumable).
    """
    if not 0 <= duration <= 1:
        raise ValueError(f"duration must be in [0, 1], got {duration}")
    if min_seq_length < 1 or step_size < 1:
        raise ValueError(
            f"min_seq_length and step_size must be >= 1, got {min_seq_length} and {step_size}"
        )
    if max_seq_length < min_seq_length:
        raise ValueError(
            f"max_seq_length={max_seq_length} must be >= min_seq_length={min_seq_length}"
        )

    def transform(state, batch):
        ts = state.timestamp
        if not ts.max_batches:
            raise ValueError(
                "seq_length_warmup depends on the run's length, which is unknown; train with "
                "functrain.fit(..., duration=...) or set timestamp.max_batches"
            )
        length = warmup_sequence_length(
            ts.batch, ts.max_batches, duration, min_seq_length, max_seq_length, step_size
        )
        return set_batch_sequence_length(batch, length, truncate, preserve_end_of_sequence)

    return batch_algorithm("seq_length_warmup", transform)
