"""Selective backprop as a step transform (Composer's `SelectiveBackprop`).

Inside `[start, end)` of the run (fractions; `fit` sets the run's length), except on every
`interrupt`-th batch of an epoch, the step first scores each example with a gradient-free forward
pass (`step.pieces.call_model`, optionally on inputs downsampled by `scale_factor`) and
`loss_fun(outputs, targets, reduction="none")`, then keeps `int(keep * N)` examples drawn by loss
rank from the step's key; the gradient step runs on those. Every per-example tensor of the batch is
pruned alike.

The scoring pass runs on copies of the buffers (BatchNorm statistics are not updated by it; in
Composer they are) and with the global generator seeded from the step's key (dropout masks are
reproducible), so the transform stays pure and resumes exactly.

Order: list it before label_smoothing/mixup/cutmix (it needs the real targets) and after the
input transforms whose outputs it should score.

Example:
    >>> step = functrain.compose(step, selective_backprop(start=0.5, end=0.9, keep=0.5))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..data import num_samples
from ..functional.batch import get_item, take
from ..functional.selective_backprop import (
    per_example_losses,
    select_indices_using_loss,
    should_selective_backprop,
)
from ..parallel import data_parallel_info
from ..rng import seed_for, seeded_global_rng
from ..step import Algorithm, StepPieces
from .batch_transform import elapsed_duration, step_generator
from .mixed_targets import check_plain_target


def selective_backprop(
    start: float = 0.5,
    end: float = 0.9,
    keep: float = 0.5,
    scale_factor: float = 1.0,
    interrupt: int = 2,
    loss_fun: Callable[..., torch.Tensor] = F.cross_entropy,
    input_key: Any = 0,
    target_key: Any = 1,
) -> Algorithm:
    """Backpropagate only through a loss-weighted sample of each batch.

    Args:
        start, end: the part of the run (fractions) where batches are pruned. Default 0.5, 0.9.
        keep: fraction of each batch kept, in (0, 1] (1: never prune). Default 0.5.
        scale_factor: downsampling of the scoring pass's inputs, in (0, 1]. Default 1.
        interrupt: every `interrupt`-th batch is not pruned (0: prune all). Default 2.
        loss_fun: per-example loss `loss_fun(outputs, targets, reduction="none")`
            (Composer uses the model's loss; default cross-entropy).
        input_key, target_key: where inputs and targets sit in the batch.
    Returns:
        the `Algorithm` "selective_backprop" (stateless, exactly resumable).
    """
    if not 0 <= start <= end <= 1:
        raise ValueError(f"need 0 <= start <= end <= 1, got start={start}, end={end}")
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    if not 0 < scale_factor <= 1:
        raise ValueError(f"scale_factor must be in (0, 1], got {scale_factor}")
    if interrupt < 0:
        raise ValueError(f"interrupt must be >= 0, got {interrupt}")

    def apply(pieces: StepPieces) -> StepPieces:
        inner_prepare, call_model = pieces.prepare, pieces.call_model

        def prepare(state, batch):
            batch = inner_prepare(state, batch)
            if keep >= 1:
                return batch
            chosen = should_selective_backprop(
                elapsed_duration(state, "selective_backprop"),
                state.timestamp.batch_in_epoch,
                start,
                end,
                interrupt,
            )
            if not chosen:
                return batch
            inputs, targets = get_item(batch, input_key), get_item(batch, target_key)
            check_plain_target(targets, "selective_backprop")
            scoring_state = state.replace(buffers={k: v.clone() for k, v in state.buffers.items()})
            rank, _ = data_parallel_info(state.layout)
            seed = seed_for(state.rng, state.step, "selective_backprop/forward", rank)
            device = inputs.device

            def model(x):
                with seeded_global_rng(seed, device):
                    return call_model(scoring_state, x)

            losses = per_example_losses(inputs, targets, model, loss_fun, scale_factor)
            selected = select_indices_using_loss(
                losses, keep, generator=step_generator(state, "selective_backprop")
            )
            if num_samples(batch) != inputs.shape[0]:
                raise ValueError("the batch's tensors do not share the inputs' batch dimension")
            return take(batch, selected)

        return pieces._replace(prepare=prepare)

    return Algorithm(name="selective_backprop", apply=apply)
