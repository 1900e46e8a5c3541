"""GyroDropout (Park et al., 2022): dropout that trains a small ensemble of fixed subnetworks.

`sigma` dropout masks over the features are drawn once per run. Every so many steps, `tau` of
them are picked, and the batch is split into `tau` equal groups, each trained with one mask (and
the usual `1 / (1 - p)` rescaling). In eval mode the layer is the identity.

Which masks a forward uses is data in two buffers, so the module stays a pure function of its
inputs, and the `gyro_dropout` algorithm sets them from the run's key and time:
`mask_seed` (0-d int64, fixes the `sigma` masks) and `mask_index` (`(tau,)` int64, the picked
masks). Without the algorithm the layer keeps the masks it was built with.

Example:
    >>> layer = GyroDropout(p=0.5, sigma=8, tau=2)
    >>> layer(torch.ones(4, 6)).shape
    torch.Size([4, 6])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules


def gyro_masks(seed: int, sigma: int, features: int, p: float, device=None) -> torch.Tensor:
    """The run's `(sigma, features)` 0/1 keep-masks, drawn from `seed`."""
    generator = torch.Generator(device=device or "cpu").manual_seed(int(seed))
    draws = torch.rand(sigma, features, generator=generator, device=device)
    return (draws > p).float()


class GyroDropout(nn.Module):
    """Dropout over a fixed pool of `sigma` masks, `tau` of them active at a time.

    Args:
        p: drop probability of each feature in each mask.
        sigma: number of masks in the pool.
        tau: masks active per step (the batch size must be a multiple of it).
    """

    mask_seed: torch.Tensor  # buffers (registered in __init__), typed for the checker
    mask_index: torch.Tensor

    def __init__(self, p: float = 0.5, sigma: int = 256, tau: int = 16):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"GyroDropout p must be in [0, 1), got {p}")
        if sigma <= 0 or not 0 < tau <= sigma:
            raise ValueError(
                f"GyroDropout needs sigma > 0 and 0 < tau <= sigma, got {sigma}, {tau}"
            )
        self.p, self.sigma, self.tau = float(p), int(sigma), int(tau)
        self.register_buffer("mask_seed", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mask_index", torch.arange(self.tau, dtype=torch.int64))

    def extra_repr(self) -> str:
        return f"p={self.p}, sigma={self.sigma}, tau={self.tau}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        batch, features = x.shape[0], x.shape[1]
        if batch % self.tau:
            raise ValueError(
                f"GyroDropout splits the batch into tau={self.tau} groups; the batch size {batch} "
                "is not a multiple of it (change the batch size or tau)"
            )
        pool = gyro_masks(int(self.mask_seed), self.sigma, features, self.p, x.device)
        masks = pool[self.mask_index].to(x.dtype).repeat_interleave(batch // self.tau, dim=0)
        masks = masks.reshape(batch, features, *([1] * (x.dim() - 2)))
        return x * masks / (1.0 - self.p)


def apply_gyro_dropout(
    model: nn.Module, p: float = 0.5, sigma: int = 256, tau: int = 16, optimizers: Any = None
) -> nn.Module:
    """A copy of `model` with every `nn.Dropout` replaced by `GyroDropout(p, sigma, tau)`.

    Raises:
        ValueError: when the model has no `nn.Dropout`.
    """
    check_module(model, "apply_gyro_dropout")
    reject_optimizers("apply_gyro_dropout", optimizers)
    count = 0

    def policy(name: str, module: nn.Module):
        nonlocal count
        if type(module) is nn.Dropout:
            count += 1
            return GyroDropout(p, sigma, tau)
        return None

    new = replace_modules(model, policy)
    if count == 0:
        raise ValueError("apply_gyro_dropout found no nn.Dropout module to replace")
    return new
