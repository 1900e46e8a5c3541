"""Stochastic depth: surgery plus a `grads` wrapper that warms the drop rate up over time.

The surgery (`functrain.functional.apply_stochastic_depth`) wraps each target block in a
`StochasticBlock` with two buffers: `target_drop_rate` (its rate after warm-up) and `drop_rate`
(the rate the forward uses). Modules cannot see time, so the step part sets, before every
forward, `drop_rate = target_drop_rate * min(1, batches / warmup_batches)` in the state's
buffers. That keeps the model a pure function of (params, buffers, batch), checkpoints the
current rate with the buffers, and resumes exactly. Drops draw from the global generator, which
the step seeds from the run's key and the data-parallel rank, so ranks drop different blocks
(Composer's `use_same_gpu_seed=False` behaviour; its default drops the same blocks everywhere).

Example:
    >>> algorithm = stochastic_depth("ResidualBlock", stochastic_method="block", drop_rate=0.2)
    >>> model = apply_surgery(model, [algorithm])
    >>> step = functrain.compose(functrain.make_step(model, loss_fn, opt), algorithm)
"""

from __future__ import annotations

from ..functional.stochastic_depth import DISTRIBUTIONS, METHODS, apply_stochastic_depth
from ..state import TrainState
from ..step import Algorithm, StepPieces
from ..units import Time
from .surgery import surgery_algorithm

TARGET_SUFFIX = ".target_drop_rate"
CURRENT_SUFFIX = ".drop_rate"


def warmup_factor(state: TrainState, warmup: Time) -> float:
    """`min(1, batches done / warmup batches)` (1 when there is no warm-up)."""
    if warmup.value == 0:
        return 1.0
    total = state.timestamp.to_batches(warmup)
    return min(1.0, state.timestamp.batch / total) if total > 0 else 1.0


def with_drop_rates(state: TrainState, factor: float) -> TrainState:
    """`state` with every stochastic block's `drop_rate` set to `factor * target_drop_rate`."""
    updates = {}
    for name, target in state.buffers.items():
        if name.endswith(TARGET_SUFFIX):
            current = name[: -len(TARGET_SUFFIX)] + CURRENT_SUFFIX
            if current in state.buffers:
                updates[current] = (target * factor).to(state.buffers[current].dtype)
    if not updates:
        return state
    return state.replace(buffers={**state.buffers, **updates})


def stochastic_depth(
    target_layer_name,
    stochastic_method: str = "block",
    drop_rate: float = 0.2,
    drop_distribution: str = "linear",
    drop_warmup: str = "0.0dur",
) -> Algorithm:
    """Randomly drop residual branches in training.

    Args:
        target_layer_name: the block class or class name to wrap ("ResidualBlock" for
            `functrain.models.SmallResNet`, "Bottleneck"/"BasicBlock" for torchvision ResNets),
            or a tuple of them.
        stochastic_method: "block" (drop a block for the whole batch) or "sample" (per sample).
        drop_rate: drop probability (of the deepest block with "linear").
        drop_distribution: "linear" (grows with depth) or "uniform".
        drop_warmup: time over which the rates ramp up linearly from 0 (any unit `to_batches`
            resolves; "0.0dur" for none).
    Returns:
        the `Algorithm` named "stochastic_depth": run `apply_surgery` with it before `init`, and
        compose it into the step (exactly resumable).
    """
    if stochastic_method not in METHODS:
        raise ValueError(f"stochastic_method must be one of {METHODS}, got {stochastic_method!r}")
    if drop_distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"drop_distribution must be one of {DISTRIBUTIONS}, got {drop_distribution!r}"
        )
    if not 0.0 <= drop_rate <= 1.0:
        raise ValueError(f"drop_rate must be in [0, 1], got {drop_rate}")
    warmup = Time.coerce(drop_warmup)

    def apply(pieces: StepPieces) -> StepPieces:
        if warmup.value == 0:
            return pieces  # the surgery already set every drop_rate to its target
        inner = pieces.grads

        def grads(all_pieces, state, batch):
            return inner(all_pieces, with_drop_rates(state, warmup_factor(state, warmup)), batch)

        return pieces._replace(grads=grads)

    return surgery_algorithm(
        "stochastic_depth",
        lambda m: apply_stochastic_depth(
            m, target_layer_name, stochastic_method, drop_rate, drop_distribution
        ),
        apply=apply,
    )
