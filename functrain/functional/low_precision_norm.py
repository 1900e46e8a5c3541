"""Low-precision LayerNorm and GroupNorm: run the norm in the autocast dtype.

Autocast runs `layer_norm` and `group_norm` in float32 for safety, which costs a cast and a
float32 kernel per norm. These drop-in subclasses cast the input, weight and bias to the autocast
dtype (bfloat16 or float16) and run the norm there. Outside autocast they are exactly
`nn.LayerNorm` / `nn.GroupNorm` (same parameters and names, so checkpoints are interchangeable).

Example:
    >>> model = apply_low_precision_layernorm(torch.nn.LayerNorm(8))
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     model(torch.randn(2, 8)).dtype
    torch.bfloat16
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .module_surgery import check_module, reclass, reject_optimizers, replace_modules


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The active autocast dtype on `device_type`, or None outside autocast."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _cast(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(dtype)


class LPLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` that runs in the autocast dtype under autocast."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = _autocast_dtype(x.device.type)
        if dtype is None:
            return super().forward(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.layer_norm(
                x.to(dtype),
                self.normalized_shape,
                _cast(self.weight, dtype),
                _cast(self.bias, dtype),
                self.eps,
            )


class LPGroupNorm(nn.GroupNorm):
    """`nn.GroupNorm` that runs in the autocast dtype under autocast."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = _autocast_dtype(x.device.type)
        if dtype is None:
            return super().forward(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.group_norm(
                x.to(dtype),
                self.num_groups,
                _cast(self.weight, dtype),
                _cast(self.bias, dtype),
                self.eps,
            )


def apply_low_precision_layernorm(
    model: nn.Module, precision: Any = None, optimizers: Any = None
) -> nn.Module:
    """A copy of `model` with every `nn.LayerNorm` replaced by `LPLayerNorm` (same weights).

    Args:
        model: the model (not modified).
        precision: Composer's argument: the run's precision ("amp_bf16", "amp_fp16", ...). The
            replacement only matters under autocast, so any other precision leaves the copy
            unchanged with a warning, as Composer does; None replaces (functrain's default).
        optimizers: Composer's argument; only None (see `module_surgery.reject_optimizers`).
    """
    check_module(model, "apply_low_precision_layernorm")
    reject_optimizers("apply_low_precision_layernorm", optimizers)
    if not _applies(precision, "apply_low_precision_layernorm"):
        return copy.deepcopy(model)
    return replace_modules(
        model,
        lambda name, m: reclass(m, LPLayerNorm) if type(m) is nn.LayerNorm else None,
    )


def apply_low_precision_groupnorm(
    model: nn.Module, precision: Any = None, optimizers: Any = None
) -> nn.Module:
    """A copy of `model` with every `nn.GroupNorm` replaced by `LPGroupNorm` (same weights).

    Args:
        model: the model (not modified).
        precision: Composer's argument: the run's precision ("amp_bf16", "amp_fp16", ...). The
            replacement only matters under autocast, so any other precision leaves the copy
            unchanged with a warning, as Composer does; None replaces (functrain's default).
        optimizers: Composer's argument; only None (see `module_surgery.reject_optimizers`).
    """
    check_module(model, "apply_low_precision_groupnorm")
    reject_optimizers("apply_low_precision_groupnorm", optimizers)
    if not _applies(precision, "apply_low_precision_groupnorm"):
        return copy.deepcopy(model)
    return replace_modules(
        model,
        lambda name, m: reclass(m, LPGroupNorm) if type(m) is nn.GroupNorm else None,
    )


LOW_PRECISIONS = ("amp_bf16", "amp_fp16")


def _applies(precision: Any, what: str) -> bool:
    """Whether a low-precision norm has an effect at `precision` (warns when it has none)."""
    if precision is None:
        return True
    name = str(getattr(precision, "value", precision)).lower()
    if name in LOW_PRECISIONS:
        return True
    warnings.warn(
        f"{what}(precision={name!r}) has no effect: low-precision norms matter only under "
        f"{' or '.join(LOW_PRECISIONS)}; the model is returned unchanged",
        stacklevel=3,
    )
    return False
