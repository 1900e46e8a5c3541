"""MixUp (Zhang et al., 2018): train on convex combinations of pairs of examples.

Composer's semantics: one coefficient `mixing` for the whole batch, drawn as `min(z, 1 - z)` with
`z ~ Beta(alpha, alpha)` (so the original example always dominates and training accuracy stays
meaningful), and one permutation of the batch. The mixed input is
`(1 - mixing) * input + mixing * input[indices]`; the target to train on is
`(1 - mixing) * target + mixing * target[indices]` (or the same interpolation of the two losses).

Example:
    >>> x, y = torch.eye(2), torch.tensor([0, 1])
    >>> x_mixed, y_perm, mixing = mixup_batch(x, y, mixing=0.25, indices=torch.tensor([1, 0]))
    >>> x_mixed
    tensor([[0.7500, 0.2500],
            [0.2500, 0.7500]])
    >>> y_perm
    tensor([1, 0])
"""

from __future__ import annotations

from typing import Any

import torch

from ..data import num_samples
from .batch import take
from .sampling import beta, require_generator


def sample_mixing(alpha: float, generator: torch.Generator | None) -> float:
    """MixUp's coefficient: `min(z, 1 - z)` with `z ~ Beta(alpha, alpha)`; 0 when `alpha == 0`.

    Args:
        alpha: the Beta distribution's pseudocount, >= 0.
        generator: where the draw comes from (None: an error naming the fix, when alpha > 0).
    Returns:
        a float in `[0, 0.5]`.
    """
    if alpha < 0:
        raise ValueError(f"mixup alpha must be >= 0, got {alpha}")
    if alpha == 0:
        return 0.0
    z = beta(alpha, require_generator(generator, "mixup's mixing coefficient"))
    return min(z, 1.0 - z)


def mixup_batch(
    input: torch.Tensor,
    target: Any,
    mixing: float | None = None,
    alpha: float = 0.2,
    indices: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, Any, float]:
    """Mix each example with another example of the batch.

    Args:
        input: `(N, ...)` inputs.
        target: `(N, ...)` targets (or any pytree of them); only permuted here.
        mixing: the coefficient in `[0, 1]`; drawn with `sample_mixing(alpha, generator)` if None.
        alpha: the Beta pseudocount, used only when `mixing` is None.
        indices: a permutation of `range(N)`; drawn with `torch.randperm` from `generator` if None.
        generator: the source of the draws that are not given explicitly (mixing first, then
            indices).
    Returns:
        `(input_mixed, target_perm, mixing)`: the mixed inputs, the targets of the mixed-in
        examples (`target[indices]`), and the coefficient used.
    Raises:
        ValueError: on a coefficient outside `[0, 1]`, indices of the wrong length, or a random
            choice without a generator.
    """
    n = input.shape[0]
    if mixing is None:
        mixing = sample_mixing(alpha, generator)
    if not 0.0 <= float(mixing) <= 1.0:
        raise ValueError(f"mixup's mixing coefficient must be in [0, 1], got {mixing}")
    if indices is None:
        indices = torch.randperm(n, generator=require_generator(generator, "mixup's permutation"))
    if indices.shape != (n,):
        raise ValueError(
            f"indices must be a permutation of {n} samples, got shape {tuple(indices.shape)}"
        )
    if num_samples(target) != n:
        raise ValueError(f"input has {n} samples but target has {num_samples(target)}")
    indices = indices.to(input.device)
    input_mixed = (1 - mixing) * input + mixing * input[indices]
    return input_mixed, take(target, indices), mixing
