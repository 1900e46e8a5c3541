"""Fused LayerNorm: swap `nn.LayerNorm` for NVIDIA Apex's fused kernel where available.

Apex's `FusedLayerNorm` needs CUDA and the `apex` package. Where either is missing (on CPU, for
instance) there is nothing faster to swap in: `apply_fused_layernorm` warns and returns an
unchanged copy.

Example:
    >>> model = apply_fused_layernorm(torch.nn.LayerNorm(4))  # on CPU: a warning, same model
"""

from __future__ import annotations

import copy
import importlib.util
import warnings
from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules


def fused_layernorm_available() -> bool:
    """True when Apex's fused LayerNorm can run here (CUDA and `apex` installed)."""
    return torch.cuda.is_available() and importlib.util.find_spec("apex") is not None


def apply_fused_layernorm(model: nn.Module, optimizers: Any = None) -> nn.Module:
    """A copy of `model` with `nn.LayerNorm`s replaced by Apex's `FusedLayerNorm` (same weights).

    Without CUDA or Apex: warns and returns an unchanged copy.
    """
    check_module(model, "apply_fused_layernorm")
    reject_optimizers("apply_fused_layernorm", optimizers)
    if not fused_layernorm_available():
        warnings.warn(
            "fused LayerNorm is not available here (it needs CUDA and NVIDIA Apex); "
            "apply_fused_layernorm left the model unchanged",
            stacklevel=2,
        )
        return copy.deepcopy(model)
    from apex.normalization import FusedLayerNorm  # only importable with apex installed

    def policy(name: str, module: nn.Module):
        if type(module) is not nn.LayerNorm:
            return None
        fused = FusedLayerNorm(module.normalized_shape, module.eps, module.elementwise_affine)
        fused.to(module.weight.device if module.weight is not None else "cuda")
        with torch.no_grad():
            if module.weight is not None:
                fused.weight.copy_(module.weight)
            if module.bias is not None:
                fused.bias.copy_(module.bias)
            elif getattr(fused, "bias", None) is not None:
                fused.bias.zero_()
        return fused

    return replace_modules(model, policy)
