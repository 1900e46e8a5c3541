"""Squeeze-and-Excitation (Hu et al., 2018) after wide convolutions.

Each `Conv2d` whose input and output both have at least `min_channels` channels is followed by a
squeeze-excite block: global average pool -> Linear(C, latent) -> ReLU -> Linear(latent, C) ->
sigmoid, and the conv's output channels are rescaled by those gates (each in (0, 1)).

Example:
    >>> model = apply_squeeze_excite(torch.nn.Conv2d(8, 8, 3), latent_channels=4, min_channels=8)
    >>> type(model).__name__
    'SqueezeExciteConv2d'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules


def resolve_latent(latent: float, features: int) -> int:
    """`latent` as a count: values below 1 are a fraction of `features` (at least 1)."""
    if latent <= 0:
        raise ValueError(f"latent size must be positive (a count, or a fraction < 1), got {latent}")
    return max(1, int(latent * features)) if latent < 1 else int(latent)


class SqueezeExcite2d(nn.Module):
    """Channel gates computed from the globally pooled input.

    Args:
        num_features: channels of the input.
        latent_channels: hidden width of the gate MLP (a fraction of `num_features` if < 1).
    """

    def __init__(self, num_features: int, latent_channels: float = 0.125):
        super().__init__()
        self.latent_channels = resolve_latent(latent_channels, num_features)
        self.pool_and_mlp = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(num_features, self.latent_channels, bias=False),
            nn.ReLU(),
            nn.Linear(self.latent_channels, num_features, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = self.pool_and_mlp(x)
        return x * gates.reshape(x.shape[0], x.shape[1], 1, 1)


class SqueezeExciteConv2d(nn.Module):
    """A convolution followed by a `SqueezeExcite2d` on its output."""

    def __init__(self, conv: nn.Conv2d, latent_channels: float = 0.125):
        super().__init__()
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_channels, latent_channels)
        self.se.to(device=conv.weight.device, dtype=conv.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(x))


def apply_squeeze_excite(
    model: nn.Module, latent_channels: float = 64, min_channels: int = 128, optimizers: Any = None
) -> nn.Module:
    """A copy of `model` with a squeeze-excite block after every wide `Conv2d`.

    Args:
        model: the model (not modified).
        latent_channels: hidden width of each gate MLP (a fraction of the channels if < 1).
        min_channels: only convolutions with `min(in_channels, out_channels) >= min_channels`.
    Returns:
        the new model (new gate parameters are freshly initialised).
    """
    check_module(model, "apply_squeeze_excite")
    reject_optimizers("apply_squeeze_excite", optimizers)

    def policy(name: str, module: nn.Module):
        if (
            type(module) is nn.Conv2d
            and min(module.in_channels, module.out_channels) >= min_channels
        ):
            return SqueezeExciteConv2d(module, latent_channels)
        return None

    return replace_modules(model, policy)
