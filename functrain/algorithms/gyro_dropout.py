"""GyroDropout: surgery plus a `grads` wrapper that picks the active masks from the run's key.

The surgery replaces `nn.Dropout` layers with `GyroDropout` (see
`functrain.functional.gyro_dropout`). Before every forward, the step part writes into the state's
buffers which masks are used: the pool seed (fixed for the run) and `tau` indices into the pool,
redrawn every `int(max_batches / sigma) * tau` batches (Composer's period) from
`key_for(state.rng, period, "gyro_dropout/<layer>")`. Everything is a function of the state, so
runs resume exactly. The key is the same on every data-parallel rank, so all ranks train the same
subnetworks (as Composer's shared seed does).

Example:
    >>> algorithm = gyro_dropout(p=0.5, sigma=256, tau=16)
    >>> model = apply_surgery(model, [algorithm])
    >>> step = functrain.compose(functrain.make_step(model, loss_fn, opt), algorithm)
"""

from __future__ import annotations

import torch

from ..functional.gyro_dropout import apply_gyro_dropout
from ..rng import key_for, seed_for
from ..state import TrainState
from ..step import Algorithm, StepPieces
from .surgery import surgery_algorithm

SEED_SUFFIX = ".mask_seed"
INDEX_SUFFIX = ".mask_index"


def mask_period(max_batches: int, sigma: int, tau: int) -> int:
    """Batches between redraws of the active masks (at least 1)."""
    return max(1, int(max_batches / sigma) * tau)


def with_gyro_masks(
    state: TrainState, sigma: int, tau: int, max_batches: int | None = None
) -> TrainState:
    """`state` with every GyroDropout layer's mask seed and active-mask indices for this step.

    The masks are paced by `max_batches` when given (Composer's `iters_per_epoch * max_epoch`),
    else by the run's horizon (`state.timestamp.max_batches`, set by `fit`).
    """
    layers = [k[: -len(SEED_SUFFIX)] for k in state.buffers if k.endswith(SEED_SUFFIX)]
    layers = [name for name in layers if name + INDEX_SUFFIX in state.buffers]
    if not layers:
        return state
    ts = state.timestamp
    total = int(max_batches) if max_batches else ts.max_batches
    if not total:
        raise ValueError(
            "gyro_dropout needs the run's length (timestamp.max_batches) to pace its masks; train "
            "with functrain.fit(..., duration=...) or set state.timestamp.replace(max_batches=...)"
        )
    period = ts.batch // mask_period(total, sigma, tau)
    updates = {}
    for name in layers:
        purpose = f"gyro_dropout/{name}"
        seed_buffer = state.buffers[name + SEED_SUFFIX]
        index_buffer = state.buffers[name + INDEX_SUFFIX]
        seed = seed_for(state.rng, 0, purpose)  # the pool is fixed for the whole run
        index = torch.randint(sigma, (tau,), generator=key_for(state.rng, period, purpose))
        updates[name + SEED_SUFFIX] = torch.tensor(
            seed, dtype=seed_buffer.dtype, device=seed_buffer.device
        )
        updates[name + INDEX_SUFFIX] = index.to(
            device=index_buffer.device, dtype=index_buffer.dtype
        )
    return state.replace(buffers={**state.buffers, **updates})


def gyro_dropout(
    p: float = 0.5,
    sigma: int = 256,
    tau: int = 16,
    iters_per_epoch: int | None = None,
    max_epoch: int | None = None,
) -> Algorithm:
    """Replace dropout with GyroDropout and drive its masks.

    Args:
        p: drop probability per feature.
        sigma: masks in the pool, drawn once per run.
        tau: masks active at a time; the batch splits into `tau` groups (batch size must be a
            multiple of `tau`).
        iters_per_epoch, max_epoch: Composer's arguments; together they give the batches the
            masks are paced over (`iters_per_epoch * max_epoch`). Without them, the run's length
            from `fit` is used (the same number when the run lasts `max_epoch` epochs).
    Returns:
        the `Algorithm` named "gyro_dropout": `apply_surgery` with it before `init`, and compose
        it into the step. Needs the run's horizon (`fit` sets it).
    """
    if not 0 <= p < 1:
        raise ValueError(f"gyro_dropout p must be in [0, 1), got {p}")
    if sigma <= 0 or not 0 < tau <= sigma:
        raise ValueError(f"gyro_dropout needs sigma > 0 and 0 < tau <= sigma, got {sigma}, {tau}")

    if (iters_per_epoch is None) != (max_epoch is None):
        raise ValueError("gyro_dropout takes iters_per_epoch and max_epoch together, or neither")
    total = None
    if iters_per_epoch is not None and max_epoch is not None:  # both or neither (checked above)
        if int(iters_per_epoch) <= 0 or int(max_epoch) <= 0:
            raise ValueError(
                f"iters_per_epoch and max_epoch must be positive, got {iters_per_epoch}, {max_epoch}"
            )
        total = int(iters_per_epoch) * int(max_epoch)

    def apply(pieces: StepPieces) -> StepPieces:
        inner = pieces.grads

        def grads(all_pieces, state, batch):
            return inner(all_pieces, with_gyro_masks(state, sigma, tau, total), batch)

        return pieces._replace(grads=grads)

    return surgery_algorithm(
        "gyro_dropout", lambda m: apply_gyro_dropout(m, p=p, sigma=sigma, tau=tau), apply=apply
    )
