"""Label smoothing (Szegedy et al., 2016): shrink targets towards the uniform distribution.

The smoothed targets are `(1 - smoothing) * targets + smoothing / num_classes`, Composer's
`smooth_labels` formula; index targets are one-hot encoded first.

Example:
    >>> smooth_labels(torch.zeros(1, 4), torch.tensor([0]), smoothing=0.2)
    tensor([[0.8500, 0.0500, 0.0500, 0.0500]])
"""

from __future__ import annotations

import torch

from .targets import ensure_targets_one_hot


def smooth_labels(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1
) -> torch.Tensor:
    """Targets shrunk towards the uniform distribution over classes.

    Args:
        logits: the model's outputs (or any tensor of their shape), `(N, C, ...)`; only its shape
            is used.
        target: class indices `(N, ...)` or probabilities shaped like `logits`.
        smoothing: strength in `[0, 1]`; 0 leaves the (one-hot) targets, 1 gives the uniform one.
    Returns:
        float targets shaped like `logits`.
    Raises:
        ValueError: when `smoothing` is outside `[0, 1]`.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    target = ensure_targets_one_hot(logits, target)
    num_classes = logits.shape[1]
    return (target * (1.0 - smoothing)) + (smoothing / num_classes)
