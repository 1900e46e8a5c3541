"""Weight standardization (Qiao et al., 2019): convolve with per-filter standardized weights.

Each output filter's weights are shifted to mean 0 and scaled to variance 1 (over its input
channels and kernel) before the convolution, which smooths the loss landscape, notably with
GroupNorm. The stored parameter is unchanged (`weight`, same name), so the convolution's output is
invariant to positive rescaling and shifting of each filter.

Example:
    >>> conv = apply_weight_standardization(torch.nn.Conv2d(3, 4, 3))
    >>> type(conv).__name__
    'StandardizedConv2d'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reclass, reject_optimizers, replace_modules

EPS = 1e-10  # Composer's choice: only guards exactly-constant filters


def standardize_weight(weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """`(W - mean) / sqrt(var + eps)` per output filter (dim 0), biased variance."""
    dims = tuple(range(1, weight.dim()))
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class StandardizedConv1d(nn.Conv1d):
    """`nn.Conv1d` with standardized weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, standardize_weight(self.weight), self.bias)


class StandardizedConv2d(nn.Conv2d):
    """`nn.Conv2d` with standardized weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, standardize_weight(self.weight), self.bias)


class StandardizedConv3d(nn.Conv3d):
    """`nn.Conv3d` with standardized weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, standardize_weight(self.weight), self.bias)


_STANDARDIZED: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv1d: StandardizedConv1d,
    nn.Conv2d: StandardizedConv2d,
    nn.Conv3d: StandardizedConv3d,
}


def apply_weight_standardization(
    model: nn.Module, n_last_layers_ignore: int = 0, optimizers: Any = None
) -> nn.Module:
    """A copy of `model` whose convolutions standardize their weights.

    Args:
        model: the model (not modified).
        n_last_layers_ignore: leave this many of the last convolutions (in module order) plain.
    Returns:
        the new model (same parameters and names).
    """
    check_module(model, "apply_weight_standardization")
    reject_optimizers("apply_weight_standardization", optimizers)
    if n_last_layers_ignore < 0:
        raise ValueError(f"n_last_layers_ignore must be >= 0, got {n_last_layers_ignore}")
    total = sum(type(m) in _STANDARDIZED for m in model.modules())
    budget = max(total - n_last_layers_ignore, 0)
    seen = 0

    def policy(name: str, module: nn.Module):
        nonlocal seen
        cls = _STANDARDIZED.get(type(module))
        if cls is None:
            return None
        seen += 1
        return reclass(module, cls) if seen <= budget else None

    return replace_modules(model, policy)
