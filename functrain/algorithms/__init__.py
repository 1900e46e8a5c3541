"""Speedup algorithms: pure transforms of the step's pieces (Composer's catalogue, same names).

Each function returns an `Algorithm`; `functrain.compose(step, *algorithms)` applies them in
order. Model-surgery algorithms also carry a `Module -> Module` function that
`apply_surgery(model, algorithms)` runs before `functrain.init`.

Example:
    >>> algorithms = [blurpool(), ema(half_life="100ba"), label_smoothing(0.1)]
    >>> model = apply_surgery(model, algorithms)
    >>> state = functrain.init(model, optimizer)
    >>> step = functrain.compose(functrain.make_step(model, loss_fn, optimizer), *algorithms)
"""

import importlib

from ..step import Algorithm
from .activation_checkpointing import activation_checkpointing
from .activation_offload import activation_offload
from .alibi import alibi
from .ema import EMAState, ema, ema_params, swap_in_ema
from .gradient_clipping import gradient_clipping
from .gyro_dropout import gyro_dropout
from .layer_freezing import layer_freezing
from .rollback import LossSpikeError, rollback_guard, skipped_batches, skipped_ranges
from .sam import sam
from .stochastic_depth import stochastic_depth
from .surgery import (
    apply_surgery,
    blurpool,
    channels_last,
    factorize,
    fused_layernorm,
    gated_linear_units,
    ghost_batchnorm,
    low_precision_groupnorm,
    low_precision_layernorm,
    squeeze_excite,
    surgery_algorithm,
    surgery_of,
    weight_standardization,
)
from .swa import SWAState, swa, swa_params

__all__ = [
    "Algorithm",
    "activation_checkpointing",
    "activation_offload",
    "EMAState",
    "SWAState",
    "alibi",
    "apply_surgery",
    "blurpool",
    "channels_last",
    "ema",
    "ema_params",
    "factorize",
    "fused_layernorm",
    "gated_linear_units",
    "ghost_batchnorm",
    "gradient_clipping",
    "gyro_dropout",
    "layer_freezing",
    "LossSpikeError",
    "low_precision_groupnorm",
    "low_precision_layernorm",
    "rollback_guard",
    "sam",
    "squeeze_excite",
    "skipped_batches",
    "skipped_ranges",
    "stochastic_depth",
    "surgery_algorithm",
    "surgery_of",
    "swa",
    "swa_params",
    "swap_in_ema",
    "weight_standardization",
]

# The data-side algorithms live in their own modules (one per method, same name as the function);
# import them guarded so that a module still being written does not break this package.
_DATA_ALGORITHMS = (
    "label_smoothing",
    "mixup",
    "cutmix",
    "cutout",
    "colout",
    "randaugment",
    "augmix",
    "progressive_resizing",
    "seq_length_warmup",
    "selective_backprop",
)


def _import_data_algorithms() -> None:
    for name in _DATA_ALGORITHMS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ImportError:  # pragma: no cover - only while a module is missing
            continue
        globals()[name] = getattr(module, name)
        __all__.append(name)


_import_data_algorithms()
