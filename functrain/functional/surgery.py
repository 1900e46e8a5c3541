"""Model surgery, all in one place: every `Module -> Module` transform and its building blocks.

Each `apply_*` function returns a modified deep copy (the input model is never changed); apply
surgery before `functrain.init`, so the state is built from the final architecture.

Example:
    >>> from functrain.models import SmallResNet
    >>> model = apply_blurpool(apply_channels_last(SmallResNet()))
"""

from .alibi import alibi_slopes, apply_alibi, scale_sequence_length
from .alibi_hf import alibi_attention
from .blurpool import (
    BlurConv2d,
    BlurMaxPool2d,
    apply_blurpool,
    binomial_filter_2d,
    blur_2d,
    blurmax_pool2d,
)
from .channels_last import apply_channels_last
from .factorize import (
    FactorizedConv2d,
    FactorizedLinear,
    apply_factorization,
    factorize_conv2d_module,
    factorize_linear,
    factorizing_could_speedup,
    low_rank_factors,
)
from .factorize_solvers import LowRankSolution, factorize_conv2d, factorize_matrix
from .fused_layernorm import apply_fused_layernorm, fused_layernorm_available
from .gated_linear_units import GLUMLP, apply_gated_linear_units, glu_from_mlp
from .gated_linear_units_hf import BERTGatedFFOutput
from .ghost_batchnorm import (
    GhostBatchNorm1d,
    GhostBatchNorm2d,
    GhostBatchNorm3d,
    apply_ghost_batchnorm,
    ghost_batch_norm,
)
from .gyro_dropout import GyroDropout, apply_gyro_dropout, gyro_masks
from .low_precision_norm import (
    LPGroupNorm,
    LPLayerNorm,
    apply_low_precision_groupnorm,
    apply_low_precision_layernorm,
)
from .module_surgery import count_modules, reclass, replace_modules
from .squeeze_excite import SqueezeExcite2d, SqueezeExciteConv2d, apply_squeeze_excite
from .stochastic_depth import StochasticBlock, apply_stochastic_depth, layer_drop_rates, sample_drop
from .weight_standardization import (
    StandardizedConv1d,
    StandardizedConv2d,
    StandardizedConv3d,
    apply_weight_standardization,
    standardize_weight,
)

__all__ = [
    "BERTGatedFFOutput",
    "BlurConv2d",
    "BlurMaxPool2d",
    "FactorizedConv2d",
    "LowRankSolution",
    "FactorizedLinear",
    "GLUMLP",
    "GhostBatchNorm1d",
    "GhostBatchNorm2d",
    "GhostBatchNorm3d",
    "GyroDropout",
    "LPGroupNorm",
    "LPLayerNorm",
    "SqueezeExcite2d",
    "SqueezeExciteConv2d",
    "StandardizedConv1d",
    "StandardizedConv2d",
    "StandardizedConv3d",
    "StochasticBlock",
    "alibi_attention",
    "alibi_slopes",
    "apply_alibi",
    "apply_blurpool",
    "apply_channels_last",
    "apply_factorization",
    "apply_fused_layernorm",
    "apply_gated_linear_units",
    "apply_ghost_batchnorm",
    "apply_gyro_dropout",
    "apply_low_precision_groupnorm",
    "apply_low_precision_layernorm",
    "apply_squeeze_excite",
    "apply_stochastic_depth",
    "apply_weight_standardization",
    "binomial_filter_2d",
    "blur_2d",
    "blurmax_pool2d",
    "count_modules",
    "factorize_conv2d",
    "factorize_conv2d_module",
    "factorize_linear",
    "factorize_matrix",
    "factorizing_could_speedup",
    "fused_layernorm_available",
    "ghost_batch_norm",
    "glu_from_mlp",
    "gyro_masks",
    "layer_drop_rates",
    "low_rank_factors",
    "reclass",
    "replace_modules",
    "sample_drop",
    "scale_sequence_length",
    "standardize_weight",
]
