"""Layer freezing as `grads` and `update` wrappers (Composer's `LayerFreezing`).

As in Composer, the frozen set changes at epoch ends: during an epoch, the fraction frozen is
`freeze_fraction(elapsed at the epoch's start)`. Frozen parameters get zero gradients (so clipping
and metrics ignore them) and keep their values through the update (no weight decay either).

Unlike Composer, this is a pure function of `state.timestamp`, so a resumed run freezes exactly
what the uninterrupted one did. The backward pass still computes gradients of frozen layers (the
step differentiates all trainable parameters), so the saving is in optimizer work, not compute.

Example:
    >>> step = functrain.compose(step, layer_freezing(freeze_start=0.5, freeze_level=1.0))
"""

from __future__ import annotations

import torch

from ..functional.layer_freezing import freeze_fraction, frozen_names
from ..state import TrainState
from ..step import Algorithm, StepPieces


def layer_freezing(freeze_start: float = 0.5, freeze_level: float = 1.0) -> Algorithm:
    """Progressively freeze the earliest layers.

    Args:
        freeze_start: fraction of training before freezing begins, in [0, 1).
        freeze_level: fraction of layers frozen at the end of training, in [0, 1].
    Returns:
        the `Algorithm` named "layer_freezing" (stateless, exactly resumable). Needs the run's
        horizon (`functrain.fit` sets it).
    """
    freeze_fraction(0.0, freeze_start, freeze_level)  # validates the arguments

    def frozen(state: TrainState, trainable) -> list[str]:
        if freeze_level == 0:
            return []
        ts = state.timestamp
        if not ts.max_batches:
            raise ValueError(
                "layer_freezing needs the run's length (timestamp.max_batches); train with "
                "functrain.fit(..., duration=...) or set state.timestamp.replace(max_batches=...)"
            )
        epoch_start = ts.batch - ts.batch_in_epoch
        fraction = freeze_fraction(epoch_start / ts.max_batches, freeze_start, freeze_level)
        return [k for k in frozen_names(state.params, fraction) if k in trainable]

    def apply(pieces: StepPieces) -> StepPieces:
        inner_grads, inner_update = pieces.grads, pieces.update

        def grads(all_pieces, state, batch):
            result = inner_grads(all_pieces, state, batch)
            names = set(frozen(state, result.grads))
            if not names:
                return result
            zeroed = {k: torch.zeros_like(g) if k in names else g for k, g in result.grads.items()}
            return result._replace(grads=zeroed)

        def update(grad_dict, state):
            names = frozen(state, grad_dict)
            if not names:
                return inner_update(grad_dict, state)
            # a donating update writes params in place: keep copies to restore
            saved = {k: state.params[k].clone() for k in names}
            new = inner_update(grad_dict, state)
            params = dict(new.params)
            for k in names:
                if params[k] is state.params[k]:
                    params[k].copy_(saved[k])
                else:
                    params[k] = saved[k]
            return new.replace(params=params)

        return pieces._replace(grads=grads, update=update)

    return Algorithm(name="layer_freezing", apply=apply)
