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
    return _replace_norms(
        model, precision, optimizers, "apply_low_precision_layernorm", nn.LayerNorm, LPLayerNorm
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
    return _replace_norms(
        model, precision, optimizers, "apply_low_precision_groupnorm", nn.GroupNorm, LPGroupNorm
    )


def _replace_norms(model, precision, optimizers, what: str, norm: type, low_precision: type):
    """The shared body of the two `apply_low_precision_*` surgeries: checks, then a copy with
    every exact `norm` reclassed as `low_precision` (or an unchanged copy where it has no effect)."""
    check_module(model, what)
    reject_optimizers(what, optimizers)
    if not _applies(precision, what):
        return copy.deepcopy(model)
    return replace_modules(
        model, lambda name, m: reclass(m, low_precision) if type(m) is norm else None
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
        stacklevel=4,  # _applies <- _replace_norms <- apply_low_precision_* <- the caller
    )
    return False
