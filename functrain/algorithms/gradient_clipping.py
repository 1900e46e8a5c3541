"""Gradient clipping as a `transform_grads` wrapper (Composer's `GradientClipping`).

Example:
    >>> step = functrain.compose(step, gradient_clipping("norm", clipping_threshold=1.0))
"""

from __future__ import annotations

from ..functional.gradient_clipping import AGC_EPS
from ..optim import EmptyState, adaptive_grad_clip, clip_by_global_norm, clip_by_value
from ..step import Algorithm, StepPieces

CLIPPING_TYPES = ("norm", "value", "adaptive")


def gradient_clipping(clipping_type: str, clipping_threshold: float) -> Algorithm:
    """Clip gradients after they are computed and before the optimizer sees them.

    Args:
        clipping_type: "norm" (scale the global L2 norm down to the threshold), "value" (clamp
            each entry to `[-threshold, threshold]`) or "adaptive" (AGC: limit each unit's
            gradient norm to `threshold` times its weight norm).
        clipping_threshold: the norm (> 0), value or ratio (>= 0) limit. Adaptive clipping floors
            weight norms at 1e-3 (the AGC paper), so zero-initialised biases still learn.
    Returns:
        the `Algorithm` named "gradient_clipping" (stateless, exactly resumable).
    Example:
        >>> algorithm = gradient_clipping("adaptive", clipping_threshold=0.01)
    """
    if clipping_type not in CLIPPING_TYPES:
        raise ValueError(f"clipping_type must be one of {CLIPPING_TYPES}, got {clipping_type!r}")
    if clipping_threshold < 0 or (clipping_type == "norm" and clipping_threshold == 0):
        raise ValueError(
            f"clipping_threshold must be > 0 for 'norm' and >= 0 otherwise, got {clipping_threshold}"
        )
    threshold = float(clipping_threshold)
    if clipping_type == "norm":
        clip = clip_by_global_norm(threshold)
    elif clipping_type == "value":
        clip = clip_by_value(threshold)
    else:
        clip = adaptive_grad_clip(threshold, AGC_EPS)

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.transform_grads

        def transform_grads(grads, state):
            grads = inner(grads, state)
            params = {k: state.params[k] for k in grads}
            return clip.update(grads, EmptyState(), params)[0]

        return pieces._replace(transform_grads=transform_grads)

    return Algorithm(name="gradient_clipping", apply=apply)
