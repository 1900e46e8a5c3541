"""Label smoothing as a step transform (Composer's `LabelSmoothing`).

The loss is computed on `smooth_labels(outputs, targets, smoothing)`: Composer's dense smoothed
targets, so `loss_fn` must accept class probabilities (`F.cross_entropy` does). Metrics in `aux`
are computed against the original targets.

Order: free. Composed with MixUp/CutMix in either order, every target that enters the loss is
smoothed (the markers nest; see `mixed_targets`). List `selective_backprop` before it.

Example:
    >>> step = functrain.compose(step, label_smoothing(smoothing=0.1))
"""

from __future__ import annotations

from typing import Any

from ..functional.batch import get_item, set_item
from ..step import Algorithm
from .batch_transform import batch_algorithm
from .mixed_targets import SmoothedTarget


def label_smoothing(smoothing: float = 0.1, target_key: Any = 1) -> Algorithm:
    """Train on targets shrunk towards the uniform distribution.

    Args:
        smoothing: strength in [0, 1]; 0 is the identity. Default 0.1.
        target_key: where the targets sit in the batch (int, str or (getter, setter)).
    Returns:
        the `Algorithm` "label_smoothing" (stateless, exactly resumable).
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    smoothing = float(smoothing)

    def transform(state, batch):
        if smoothing == 0.0:
            return batch
        target = get_item(batch, target_key)
        return set_item(batch, target_key, SmoothedTarget(target, smoothing))

    return batch_algorithm("label_smoothing", transform, resolve_targets_at=target_key)
