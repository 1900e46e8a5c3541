"""Factorization: replace Linear and Conv2d layers by products of two thinner ones.

A `Linear(in, out)` becomes `Linear(in, r, bias=False)` then `Linear(r, out)`; a `Conv2d(in, out,
k)` becomes `Conv2d(in, r, k)` (same stride, padding, dilation) then a 1x1 `Conv2d(r, out)`. The
factors come from a truncated SVD of the weight (the conv weight read as an `out x in*k*k`
matrix), split as `U sqrt(S)` and `sqrt(S) V^T`: the best rank-r approximation, and the same
function exactly (up to rounding) when `r` is the full rank.

`apply_factorization` only factorizes layers that are wide enough and where the rank saves
multiply-adds, as Composer does.

Example:
    >>> layer = torch.nn.Linear(6, 4)
    >>> fact = factorize_linear(layer, rank=4)
    >>> x = torch.randn(3, 6)
    >>> torch.allclose(layer(x), fact(x), atol=1e-5)
    True
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules, shared_parameter_ids
from .squeeze_excite import resolve_latent


def low_rank_factors(matrix: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(left, right)` with `left @ right` the best rank-`rank` approximation of `matrix`.

    Args:
        matrix: `(out, in)`.
        rank: between 1 and `min(out, in)`.
    Returns:
        `left` `(out, rank)` and `right` `(rank, in)`.
    """
    max_rank = min(matrix.shape)
    if not 1 <= rank <= max_rank:
        raise ValueError(
            f"rank must be in [1, {max_rank}] for a {tuple(matrix.shape)} weight, got {rank}"
        )
    u, s, vh = torch.linalg.svd(matrix.detach().double(), full_matrices=False)
    root = s[:rank].sqrt()
    left = (u[:, :rank] * root).to(matrix.dtype)
    right = (root[:, None] * vh[:rank]).to(matrix.dtype)
    return left, right


class FactorizedLinear(nn.Module):
    """`module1(module0(x))` with a rank-`latent_features` bottleneck."""

    def __init__(
        self, in_features: int, out_features: int, latent_features: int, bias: bool = True
    ):
        super().__init__()
        self.latent_features = latent_features
        self.module0 = nn.Linear(in_features, latent_features, bias=False)
        self.module1 = nn.Linear(latent_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))


class FactorizedConv2d(nn.Module):
    """A kxk conv to `latent_channels`, then a 1x1 conv to the output channels."""

    def __init__(self, conv: nn.Conv2d, latent_channels: int):
        super().__init__()
        self.latent_channels = latent_channels
        self.module0 = nn.Conv2d(
            conv.in_channels,
            latent_channels,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            bias=False,
            padding_mode=conv.padding_mode,
        )
        self.module1 = nn.Conv2d(latent_channels, conv.out_channels, 1, bias=conv.bias is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))


def factorize_linear(module: nn.Linear, rank: int) -> FactorizedLinear:
    """The rank-`rank` factorization of `module` (exact at `rank = min(in, out)`)."""
    left, right = low_rank_factors(module.weight, rank)
    new = FactorizedLinear(module.in_features, module.out_features, rank, module.bias is not None)
    new.to(device=module.weight.device, dtype=module.weight.dtype)
    with torch.no_grad():
        new.module0.weight.copy_(right)
        new.module1.weight.copy_(left)
        if module.bias is not None:
            new.module1.bias.copy_(module.bias)
    return new


def factorize_conv2d_module(module: nn.Conv2d, rank: int) -> FactorizedConv2d:
    """The rank-`rank` factorization of `module` by its weight's SVD (exact at `rank = min(out,
    in*kh*kw)`). Composer's `factorize_conv2d` (fitted to activations) is in
    `factorize_solvers`."""
    if module.groups != 1:
        raise ValueError("factorize_conv2d_module supports only groups=1 convolutions")
    out_channels = module.out_channels
    left, right = low_rank_factors(module.weight.reshape(out_channels, -1), rank)
    new = FactorizedConv2d(module, rank)
    new.to(device=module.weight.device, dtype=module.weight.dtype)
    with torch.no_grad():
        new.module0.weight.copy_(right.reshape(rank, *module.weight.shape[1:]))
        new.module1.weight.copy_(left.reshape(out_channels, rank, 1, 1))
        if module.bias is not None:
            new.module1.bias.copy_(module.bias)
    return new


def factorizing_could_speedup(module: nn.Module, latent: int) -> bool:
    """True when a rank-`latent` factorization of `module` needs fewer multiply-adds."""
    if isinstance(module, nn.Linear):
        i, o = module.in_features, module.out_features
        return latent * (i + o) < i * o
    if isinstance(module, nn.Conv2d):
        area = module.kernel_size[0] * module.kernel_size[1]
        i, o = module.in_channels, module.out_channels
        return latent * (i * area + o) < i * o * area
    return False


def apply_factorization(
    model: nn.Module,
    factorize_convs: bool = True,
    factorize_linears: bool = True,
    min_channels: int = 256,
    latent_channels: float = 0.25,
    min_features: int = 256,
    latent_features: float = 128,
    optimizers: Any = None,
) -> nn.Module:
    """A copy of `model` with wide Conv2d/Linear layers factorized where that saves compute.

    Args:
        model: the model (not modified).
        factorize_convs: factorize `Conv2d`s with `min(in, out) >= min_channels`.
        factorize_linears: factorize `Linear`s with `min(in, out) >= min_features`.
        min_channels: see above.
        latent_channels: the conv rank (a fraction of `min(in, out)` if < 1).
        min_features: see above.
        latent_features: the linear rank (a fraction of `min(in, out)` if < 1).
    Returns:
        the new model. Tied weights (e.g. a language model head) are left alone.
    """
    check_module(model, "apply_factorization")
    reject_optimizers("apply_factorization", optimizers)
    new = copy.deepcopy(model)
    tied = shared_parameter_ids(new)

    def policy(name: str, module: nn.Module):
        if id(getattr(module, "weight", None)) in tied:
            return None
        if factorize_linears and type(module) is nn.Linear:
            i, o = module.in_features, module.out_features
            rank = min(resolve_latent(latent_features, min(i, o)), min(i, o))
            if min(i, o) >= min_features and factorizing_could_speedup(module, rank):
                return factorize_linear(module, rank)
        if factorize_convs and type(module) is nn.Conv2d and module.groups == 1:
            i, o = module.in_channels, module.out_channels
            rank = min(resolve_latent(latent_channels, min(i, o)), min(i, o))
            if min(i, o) >= min_channels and factorizing_could_speedup(module, rank):
                return factorize_conv2d_module(module, rank)
        return None

    return replace_modules(new, policy, copy_model=False)
