"""Model-surgery algorithms and `apply_surgery`, which runs the surgery part of a recipe.

A surgery algorithm is an `Algorithm` carrying a `Module -> Module` function. Surgery must run
before `functrain.init` (the state is built from the final architecture), so it is not part of
the step: `apply_surgery(model, algorithms)` applies it, and `compose` applies the step part
(the identity for pure surgery; a few surgeries, such as stochastic depth, also act in the step).

    algorithms = functrain.recipes.mild()
    model = apply_surgery(model, algorithms)
    state = functrain.init(model, optimizer)
    step = functrain.compose(functrain.make_step(model, loss_fn, optimizer), *algorithms)

The surgery function is found as `algorithm.surgery` when `Algorithm` has such a field, else as
the `surgery` attribute of `algorithm.apply` (set by `surgery_algorithm`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from ..functional.blurpool import apply_blurpool
from ..functional.channels_last import apply_channels_last
from ..functional.factorize import apply_factorization
from ..functional.fused_layernorm import apply_fused_layernorm
from ..functional.gated_linear_units import apply_gated_linear_units
from ..functional.ghost_batchnorm import apply_ghost_batchnorm
from ..functional.low_precision_norm import (
    apply_low_precision_groupnorm,
    apply_low_precision_layernorm,
)
from ..functional.squeeze_excite import apply_squeeze_excite
from ..functional.weight_standardization import apply_weight_standardization
from ..step import Algorithm, StepPieces

Surgery = Callable[[nn.Module], nn.Module]


def surgery_algorithm(
    name: str,
    surgery: Surgery,
    apply: Callable[[StepPieces], StepPieces] | None = None,
    init: Callable[[Any], Any] | None = None,
    resumable: bool = True,
) -> Algorithm:
    """An `Algorithm` that carries `surgery` (for `apply_surgery`) and an optional step part.

    Args:
        name: the algorithm's name.
        surgery: `Module -> Module` (on a copy).
        apply: the step part (default: leave the pieces alone).
        init: initial `algo_state[name]`, if any.
        resumable: see `Algorithm`.
    """
    return Algorithm(
        name=name,
        apply=apply if apply is not None else (lambda pieces: pieces),
        init=init,
        resumable=resumable,
        surgery=surgery,
    )


def surgery_of(algorithm: Algorithm) -> Surgery | None:
    """The `Module -> Module` function of `algorithm`, or None if it does no surgery."""
    return algorithm.surgery


def apply_surgery(model: nn.Module, algorithms: Iterable[Algorithm]) -> nn.Module:
    """`model` with the surgery of every algorithm applied, in order (the input is not modified).

    Args:
        model: the model.
        algorithms: `Algorithm`s, e.g. a recipe; those without surgery are skipped.
    Returns:
        the new model (a copy even when no algorithm does surgery).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_surgery expects a torch.nn.Module, got {type(model).__name__}")
    result = copy.deepcopy(model)
    for algorithm in algorithms:
        if not isinstance(algorithm, Algorithm):
            raise TypeError(
                f"apply_surgery takes Algorithm objects, got {type(algorithm).__name__}"
            )
        surgery = surgery_of(algorithm)
        if surgery is not None:
            result = surgery(result)
    return result


def blurpool(
    replace_convs: bool = True,
    replace_maxpools: bool = True,
    blur_first: bool = True,
    min_channels: int = 16,
) -> Algorithm:
    """BlurPool surgery (see `functrain.functional.blurpool`)."""
    return surgery_algorithm(
        "blurpool",
        lambda m: apply_blurpool(m, replace_convs, replace_maxpools, blur_first, min_channels),
    )


def channels_last() -> Algorithm:
    """Channels-last memory format surgery (see `functrain.functional.channels_last`)."""
    return surgery_algorithm("channels_last", apply_channels_last)


def squeeze_excite(latent_channels: float = 64, min_channels: int = 128) -> Algorithm:
    """Squeeze-excite surgery (see `functrain.functional.squeeze_excite`)."""
    return surgery_algorithm(
        "squeeze_excite", lambda m: apply_squeeze_excite(m, latent_channels, min_channels)
    )


def low_precision_layernorm() -> Algorithm:
    """Low-precision LayerNorm surgery (see `functrain.functional.low_precision_norm`)."""
    return surgery_algorithm("low_precision_layernorm", apply_low_precision_layernorm)


def low_precision_groupnorm() -> Algorithm:
    """Low-precision GroupNorm surgery (see `functrain.functional.low_precision_norm`)."""
    return surgery_algorithm("low_precision_groupnorm", apply_low_precision_groupnorm)


def gated_linear_units(
    act_fn=None, gated_layer_bias: bool = False, non_gated_layer_bias: bool = False
) -> Algorithm:
    """GLU surgery for transformer MLPs (see `functrain.functional.gated_linear_units`)."""
    return surgery_algorithm(
        "gated_linear_units",
        lambda m: apply_gated_linear_units(
            m,
            act_fn=act_fn,
            gated_layer_bias=gated_layer_bias,
            non_gated_layer_bias=non_gated_layer_bias,
        ),  # fmt: skip
    )


def factorize(
    factorize_convs: bool = True,
    factorize_linears: bool = True,
    min_channels: int = 256,
    latent_channels: float = 0.25,
    min_features: int = 256,
    latent_features: float = 128,
) -> Algorithm:
    """Low-rank factorization surgery (see `functrain.functional.factorize`)."""
    return surgery_algorithm(
        "factorize",
        lambda m: apply_factorization(
            m,
            factorize_convs,
            factorize_linears,
            min_channels,
            latent_channels,
            min_features,
            latent_features,
        ),
    )


def ghost_batchnorm(ghost_batch_size: int = 32) -> Algorithm:
    """Ghost BatchNorm surgery (see `functrain.functional.ghost_batchnorm`)."""
    return surgery_algorithm(
        "ghost_batchnorm", lambda m: apply_ghost_batchnorm(m, ghost_batch_size)
    )


def weight_standardization(n_last_layers_ignore: int = 0) -> Algorithm:
    """Weight-standardization surgery (see `functrain.functional.weight_standardization`)."""
    return surgery_algorithm(
        "weight_standardization", lambda m: apply_weight_standardization(m, n_last_layers_ignore)
    )


def fused_layernorm() -> Algorithm:
    """Fused LayerNorm surgery; a warning no-op without CUDA and Apex."""
    return surgery_algorithm("fused_layernorm", apply_fused_layernorm)
