"""Sharpness-aware minimization as a `grads` wrapper (Composer's `SAM`).

Every `interval`-th step computes the gradient twice: at the weights `w`, and at
`w + rho * g / (|g| + epsilon)`; the optimizer then applies the second gradient to `w`. The
reported loss and buffers are those at `w`. Other steps are ordinary steps.

Differences from Composer: the ascent direction uses the data-parallel mean gradient (Composer
uses each rank's local one), and both forward passes see the same dropout masks.

Example:
    >>> step = functrain.compose(step, sam(rho=0.05, interval=10))
"""

from __future__ import annotations

from ..functional.sam import perturb, sam_perturbation
from ..step import Algorithm, StepPieces


def sam(rho: float = 0.05, epsilon: float = 1e-12, interval: int = 1) -> Algorithm:
    """Take SAM steps every `interval` optimizer steps.

    Args:
        rho: radius of the ascent step (0: the plain step).
        epsilon: guards the ascent's division by the gradient norm.
        interval: run SAM on steps where `(state.step + 1) % interval == 0`; others are normal.
    Returns:
        the `Algorithm` named "sam" (stateless, exactly resumable). Each SAM step costs a second
        forward and backward pass.
    """
    if rho < 0 or epsilon < 0:
        raise ValueError(f"SAM needs rho >= 0 and epsilon >= 0, got rho={rho}, epsilon={epsilon}")
    if not isinstance(interval, int) or interval < 1:
        raise ValueError(f"SAM interval must be a positive int, got {interval!r}")

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.grads

        def grads(all_pieces, state, batch):
            first = inner(all_pieces, state, batch)
            if rho == 0 or (state.step + 1) % interval:
                return first
            delta = sam_perturbation(first.grads, rho, epsilon)
            ascended = state.replace(params=perturb(state.params, delta))
            second = inner(all_pieces, ascended, batch)
            return first._replace(grads=second.grads)

        return pieces._replace(grads=grads)

    return Algorithm(name="sam", apply=apply)
