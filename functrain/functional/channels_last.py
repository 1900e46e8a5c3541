"""Channels-last memory format: the same model, with 4-D weights stored NHWC.

Convolutions on tensor cores (and oneDNN on CPU) run faster in NHWC. Only the memory layout
changes, so the function is the same (up to the kernels' floating-point summation order).

Example:
    >>> model = apply_channels_last(torch.nn.Conv2d(3, 8, 3))
    >>> model.weight.is_contiguous(memory_format=torch.channels_last)
    True
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers


def apply_channels_last(model: nn.Module, optimizers: Any = None) -> nn.Module:
    """A copy of `model` whose 4-D parameters and buffers use `torch.channels_last`.

    Feed it NCHW images as usual; `x.to(memory_format=torch.channels_last)` on the input avoids a
    layout conversion inside the first convolution.
    """
    check_module(model, "apply_channels_last")
    reject_optimizers("apply_channels_last", optimizers)
    return copy.deepcopy(model).to(memory_format=torch.channels_last)
