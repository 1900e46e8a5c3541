"""ALiBi: surgery plus a `prepare` wrapper that trains on shorter sequences (Composer's `Alibi`).

The surgery (`functrain.functional.apply_alibi`) replaces position embeddings with attention
biases; the step part reshapes each training batch from `(B, T)` to
`(B / s, T * s)` with `s = train_sequence_length_scaling`, the same tokens in shorter rows, since
ALiBi models extrapolate to the full length at evaluation.

Example:
    >>> algorithm = alibi(max_sequence_length=512, train_sequence_length_scaling=0.25)
    >>> model = apply_surgery(model, [algorithm])
    >>> step = functrain.compose(functrain.make_step(model, gpt_loss, opt), algorithm)
"""

from __future__ import annotations

from ..functional.alibi import apply_alibi, scale_sequence_length
from ..step import Algorithm, StepPieces
from .surgery import surgery_algorithm


def alibi(
    max_sequence_length: int = 8192, train_sequence_length_scaling: float = 0.25
) -> Algorithm:
    """Attention with linear biases.

    Args:
        max_sequence_length: the longest sequence the model accepts after surgery.
        train_sequence_length_scaling: fraction of the sequence length trained on, in (0, 1]
            (1: batches unchanged).
    Returns:
        the `Algorithm` named "alibi" (stateless, exactly resumable): `apply_surgery` with it
        before `init`, and compose it into the step.
    """
    if max_sequence_length <= 0:
        raise ValueError(f"max_sequence_length must be positive, got {max_sequence_length}")
    if not 0 < train_sequence_length_scaling <= 1:
        raise ValueError(
            f"train_sequence_length_scaling must be in (0, 1], got {train_sequence_length_scaling}"
        )

    def apply(pieces: StepPieces) -> StepPieces:
        if train_sequence_length_scaling == 1:
            return pieces
        inner = pieces.prepare

        def prepare(state, batch):
            return scale_sequence_length(inner(state, batch), train_sequence_length_scaling)

        return pieces._replace(prepare=prepare)

    return surgery_algorithm("alibi", lambda m: apply_alibi(m, max_sequence_length), apply=apply)
