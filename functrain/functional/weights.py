"""Pure functions on gradients and weights: clipping, SAM's ascent, EMA, SWA, layer freezing.

Each takes and returns `{name: tensor}` dicts (new tensors; inputs untouched), so they compose
with any step and are easy to test.

Example:
    >>> clip_grad_norm({"w": torch.tensor([3.0, 4.0])}, max_norm=1.0)["w"]
    tensor([0.6000, 0.8000])
"""

from .ema import compute_ema, smoothing_from_half_life
from .gradient_clipping import (
    adaptive_clip_grad,
    apply_gradient_clipping,
    clip_grad_norm,
    clip_grad_value,
    global_grad_norm,
    unitwise_norm,
)
from .layer_freezing import (
    freeze_fraction,
    freeze_layers,
    frozen_names,
    layers_of,
    module_layers,
)
from .sam import perturb, sam_perturbation
from .swa import normalize_anneal_strategy, swa_average, swa_lr

__all__ = [
    "adaptive_clip_grad",
    "apply_gradient_clipping",
    "clip_grad_norm",
    "clip_grad_value",
    "compute_ema",
    "freeze_fraction",
    "freeze_layers",
    "frozen_names",
    "global_grad_norm",
    "layers_of",
    "module_layers",
    "normalize_anneal_strategy",
    "perturb",
    "sam_perturbation",
    "smoothing_from_half_life",
    "swa_average",
    "swa_lr",
    "unitwise_norm",
]
