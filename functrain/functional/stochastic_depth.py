"""Stochastic depth (Huang et al., 2016): randomly skip residual branches in training.

Target blocks (chosen by class or class name) are wrapped in `StochasticBlock`:

- "block" mode drops a block's whole residual branch for the batch with probability `drop_rate`
  (the output is then `act(shortcut(x))` with a projection shortcut, else `x`);
- "sample" mode drops the branch per sample.

In eval mode the branch is kept and scaled by `1 - drop_rate` (the expected value in training).
With `drop_distribution="linear"` block `i` of `n` gets `drop_rate * (i + 1) / n`; "uniform"
gives every block `drop_rate`.

A wrapped block must expose `residual_branch(x)` and `shortcut(x)` (as
`functrain.models.cnn.ResidualBlock` does), or follow torchvision's `BasicBlock`/`Bottleneck`
layout (`conv1`, `bn1`, `conv2`, `bn2`, optional `conv3`/`bn3`, `relu`, `downsample`). The
block's `relu` (if any) is applied after the sum, as in `relu(shortcut(x) + branch(x))`.

The current rate is a buffer (`drop_rate`, next to the block's `target_drop_rate`), so the
`stochastic_depth` algorithm can warm it up from the state's time without touching the module.
Random draws use torch's global generator, which the step seeds from the run's key.

Example:
    >>> from functrain.models import SmallResNet
    >>> model = apply_stochastic_depth(SmallResNet(), "ResidualBlock", drop_rate=0.2)
    >>> type(model.stages[0][0]).__name__
    'StochasticBlock'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules

METHODS = ("block", "sample")
DISTRIBUTIONS = ("uniform", "linear")


def _torchvision_branch(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = block.relu(block.bn1(block.conv1(x)))
    out = block.bn2(block.conv2(out))
    if hasattr(block, "conv3"):
        out = block.bn3(block.conv3(block.relu(out)))
    return out


def _has_branch_protocol(block: nn.Module) -> bool:
    return callable(getattr(block, "residual_branch", None)) and callable(
        getattr(block, "shortcut", None)
    )


def _has_torchvision_layout(block: nn.Module) -> bool:
    return all(
        hasattr(block, name) for name in ("conv1", "bn1", "conv2", "bn2", "relu", "downsample")
    )


def sample_drop(x: torch.Tensor, drop_rate: torch.Tensor, training: bool) -> torch.Tensor:
    """Zero whole samples of `x` with probability `drop_rate` (training); scale by `1 - rate` (eval)."""
    keep = 1.0 - drop_rate.to(x.dtype)
    if not training:
        return x * keep
    shape = (x.shape[0],) + (1,) * (x.dim() - 1)
    mask = torch.floor(keep + torch.rand(shape, dtype=x.dtype, device=x.device))
    return x * mask


class StochasticBlock(nn.Module):
    """A residual block whose branch is dropped at random in training.

    Args:
        block: the residual block (see the module docstring for what it must expose).
        drop_rate: its drop probability.
        method: "block" or "sample".
    """

    def __init__(self, block: nn.Module, drop_rate: float, method: str = "block"):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"stochastic_method must be one of {METHODS}, got {method!r}")
        if not (_has_branch_protocol(block) or _has_torchvision_layout(block)):
            raise TypeError(
                f"{type(block).__name__} cannot be made stochastic: it needs residual_branch(x) and "
                "shortcut(x) methods, or torchvision's BasicBlock/Bottleneck attributes"
            )
        self.block = block
        self.method = method
        self.register_buffer("target_drop_rate", torch.tensor(float(drop_rate)))
        self.register_buffer("drop_rate", torch.tensor(float(drop_rate)))

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        if _has_branch_protocol(self.block):
            return self.block.residual_branch(x)
        return _torchvision_branch(self.block, x)

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if _has_branch_protocol(self.block):
            return self.block.shortcut(x)
        return x if self.block.downsample is None else self.block.downsample(x)

    def _has_projection(self) -> bool:
        return getattr(self.block, "downsample", None) is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = getattr(self.block, "relu", None) or nn.Identity()
        if self.method == "sample":
            return act(
                self._shortcut(x) + sample_drop(self._branch(x), self.drop_rate, self.training)
            )
        if self.training:
            keep = bool(
                torch.bernoulli(1.0 - self.drop_rate.float())
            )  # global RNG, seeded by the step
            if not keep:
                return act(self._shortcut(x)) if self._has_projection() else x
            return act(self._shortcut(x) + self._branch(x))
        return act(self._shortcut(x) + self._branch(x) * (1.0 - self.drop_rate.to(x.dtype)))


def layer_drop_rates(count: int, drop_rate: float, drop_distribution: str) -> list[float]:
    """Per-block drop rates for `count` blocks in order."""
    if drop_distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"drop_distribution must be one of {DISTRIBUTIONS}, got {drop_distribution!r}"
        )
    if drop_distribution == "uniform":
        return [drop_rate] * count
    return [drop_rate * (i + 1) / count for i in range(count)]


# Composer's names for the blocks its registry knows -> the class name in torchvision's ResNet.
COMPOSER_BLOCK_NAMES = {"ResNetBottleneck": "Bottleneck", "ResNetBasicBlock": "BasicBlock"}


def _matches(module: nn.Module, target) -> bool:
    targets = target if isinstance(target, (tuple, list)) else (target,)
    for t in targets:
        if isinstance(t, str) and type(module).__name__ in (t, COMPOSER_BLOCK_NAMES.get(t)):
            return True
        if isinstance(t, type) and isinstance(module, t):
            return True
    return False


def apply_stochastic_depth(
    model: nn.Module,
    target_layer_name,
    stochastic_method: str = "block",
    drop_rate: float = 0.2,
    drop_distribution: str = "linear",
    optimizers: Any = None,
) -> nn.Module:
    """A copy of `model` with every target residual block wrapped in a `StochasticBlock`.

    Args:
        model: the model (not modified).
        target_layer_name: a block class, a class name ("ResidualBlock", "Bottleneck", ...), or a
            tuple of them; Composer's registry names are accepted too ("ResNetBottleneck" is
            torchvision's `Bottleneck`).
        stochastic_method: "block" or "sample".
        drop_rate: the drop probability (of the deepest block with "linear").
        drop_distribution: "linear" or "uniform" over the blocks' depth.
    Returns:
        the new model (parameter names gain a `.block` segment).
    Raises:
        ValueError: when no target block is found.
    """
    check_module(model, "apply_stochastic_depth")
    reject_optimizers("apply_stochastic_depth", optimizers)
    if not 0.0 <= drop_rate <= 1.0:
        raise ValueError(f"drop_rate must be in [0, 1], got {drop_rate}")
    if stochastic_method not in METHODS:
        raise ValueError(f"stochastic_method must be one of {METHODS}, got {stochastic_method!r}")
    count = sum(_matches(m, target_layer_name) for m in model.modules())
    if count == 0:
        layouts = sorted(
            {
                type(m).__name__
                for m in model.modules()
                if _has_torchvision_layout(m) or _has_branch_protocol(m)
            }
        )
        raise ValueError(
            f"apply_stochastic_depth found no {target_layer_name!r} block in the model; pass "
            "the block's class or its class name as the model has it"
            + (f" (residual blocks here: {layouts})" if layouts else "")
            + "; Composer's 'ResNetBottleneck' is torchvision's 'Bottleneck'"
        )
    rates = iter(layer_drop_rates(count, drop_rate, drop_distribution))

    def policy(name: str, module: nn.Module):
        if _matches(module, target_layer_name):
            return StochasticBlock(module, next(rates), stochastic_method)
        return None

    return replace_modules(model, policy)
