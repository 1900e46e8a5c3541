"""The shared shape of the data-side algorithms: a pure `(state, batch) -> batch` in `prepare`.

Each data algorithm (MixUp, CutOut, RandAugment, progressive resizing, ...) is a function of the
batch, the step's random key and the run's time. `batch_algorithm` turns such a function into an
`Algorithm` whose `prepare` runs it on the batch the earlier algorithms produced, so the list order
of `compose` is the order in which the batch transforms apply.

Randomness is `key_for(state.rng, state.step, name, rank)`: a pure function of the seed, the step
and the data-parallel rank (each rank augments its own shard differently), so a resumed run draws
exactly what the uninterrupted one drew.

Example:
    >>> algorithm = batch_algorithm("flip", lambda state, batch: (batch[0].flip(-1), batch[1]))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..functional.batch import get_item, set_item
from ..parallel import data_parallel_info
from ..rng import key_for
from ..state import TrainState
from ..step import Algorithm, StepPieces
from .mixed_targets import resolving_loss


def step_generator(state: TrainState, purpose: str) -> torch.Generator:
    """The generator for `purpose`'s draws at this step on this data-parallel rank."""
    rank, _ = data_parallel_info(state.layout)
    return key_for(state.rng, state.step, purpose, rank)


def elapsed_duration(state: TrainState, algorithm: str) -> float:
    """The fraction of the run done before this step (needs the run's `max_batches`)."""
    ts = state.timestamp
    if not ts.max_batches:
        raise ValueError(
            f"{algorithm} depends on the fraction of training done, but the run's length is "
            "unknown; train with functrain.fit(..., duration=...) (which sets it) or set "
            "state.replace(timestamp=state.timestamp.replace(max_batches=N))"
        )
    return ts.batch / ts.max_batches


def batch_algorithm(
    name: str,
    transform_batch: Callable[[TrainState, Any], Any],
    *,
    resolve_targets_at: Any = None,
) -> Algorithm:
    """An `Algorithm` that applies `transform_batch(state, batch)` after the earlier `prepare`s.

    Args:
        name: the algorithm's name (its key in `algo_state` and its random stream).
        transform_batch: the pure batch transform.
        resolve_targets_at: the target key, for algorithms that put target markers in the batch
            (their `loss` piece then resolves them; see `mixed_targets`).
    Returns:
        the stateless, exactly resumable `Algorithm`.
    """

    def apply(pieces: StepPieces) -> StepPieces:
        inner_prepare = pieces.prepare

        def prepare(state, batch):
            return transform_batch(state, inner_prepare(state, batch))

        changes = {"prepare": prepare}
        if resolve_targets_at is not None:
            changes["loss"] = resolving_loss(pieces.loss, resolve_targets_at)
        return pieces._replace(**changes)

    return Algorithm(name=name, apply=apply)


def image_batch_algorithm(
    name: str,
    input_key: Any,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
) -> Algorithm:
    """An `Algorithm` that replaces the images at `input_key` by `augment(images, generator)`.

    The images must be an `(N, C, H, W)` tensor; `generator` is the step's key for `name`.

    Args:
        name: the algorithm's name (its random stream, and the name its errors give).
        input_key: where the images sit in the batch.
        augment: the pure image transform, e.g. a `functrain.functional` `*_batch` function.
    Returns:
        the stateless, exactly resumable `Algorithm`.
    Example:
        >>> flip = image_batch_algorithm("flip", 0, lambda images, generator: images.flip(-1))
    """

    def transform(state, batch):
        images = get_item(batch, input_key)
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise TypeError(f"{name} needs (N, C, H, W) image tensors at key {input_key!r}")
        return set_item(batch, input_key, augment(images, step_generator(state, name)))

    return batch_algorithm(name, transform)
