"""BlurPool (Zhang, 2019): anti-aliased downsampling for strided convolutions and max-pools.

Strided `Conv2d`s (with at least `min_channels` input channels) become `BlurConv2d`: with
`blur_first=True` the input is low-pass filtered at stride 1 and then the original (strided)
convolution runs, so the cost barely changes; with `blur_first=False` the convolution runs at
stride 1 and the blur downsamples. `MaxPool2d`s become `BlurMaxPool2d`: a max at stride 1, then a
blur with the pool's stride. The filter is the binomial `[1 2 1]^T [1 2 1] / 16`, which sums to 1,
so constant regions pass unchanged, and the convolution weights are copied exactly.

Example:
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, stride=2, padding=1))
    >>> type(apply_blurpool(model)[0]).__name__
    'BlurConv2d'
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules


def _as_pair(value) -> tuple:
    """`(v, v)` for a number, the value as a tuple otherwise (a conv's stride)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def binomial_filter_2d(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 3x3 binomial low-pass filter `(1, 1, 3, 3)`, summing to 1."""
    row = torch.tensor([1.0, 2.0, 1.0], dtype=dtype)
    return (row[:, None] * row[None, :] / 16.0).reshape(1, 1, 3, 3)


def blur_2d(x: torch.Tensor, stride=1, filter: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise low-pass filtering of an NCHW tensor (zero 'same' padding), then `stride`.

    Args:
        x: `(N, C, H, W)`.
        stride: int or pair, the downsampling after filtering.
        filter: `(1, 1, kh, kw)` or `(C, 1, kh, kw)` with odd sizes (default: binomial 3x3).
    Returns:
        the blurred (and downsampled) tensor.
    """
    channels = x.shape[1]
    if filter is None:
        filter = binomial_filter_2d(x.dtype).to(x.device)
    if filter.dim() != 4 or filter.shape[1] != 1 or filter.shape[0] not in (1, channels):
        raise ValueError(
            f"the blur filter must be (1, 1, kh, kw) or (C, 1, kh, kw) with C = {channels} (the "
            f"input's channels), got {tuple(filter.shape)}; reshape a 2-D filter with "
            "filter[None, None]"
        )
    kh, kw = filter.shape[-2:]
    if kh % 2 == 0 or kw % 2 == 0:
        raise ValueError(f"the blur filter must have odd height and width, got {kh}x{kw}")
    if filter.shape[0] == 1 and channels > 1:
        filter = filter.expand(channels, 1, kh, kw)
    return F.conv2d(
        x, filter.to(x.dtype), stride=_as_pair(stride), padding=(kh // 2, kw // 2), groups=channels
    )


def blurmax_pool2d(
    x: torch.Tensor,
    kernel_size=2,
    stride=2,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    filter: torch.Tensor | None = None,
) -> torch.Tensor:
    """Max over `kernel_size` windows at stride 1, then a blur that downsamples by `stride`."""
    maxes = F.max_pool2d(
        x, kernel_size, stride=1, padding=padding, dilation=dilation, ceil_mode=ceil_mode
    )
    return blur_2d(maxes, stride=stride, filter=filter)


class BlurMaxPool2d(nn.Module):
    """Anti-aliased `MaxPool2d` (same arguments, no `return_indices`)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = ceil_mode
        self.register_buffer("filt2d", binomial_filter_2d())  # Composer's name

    @classmethod
    def from_maxpool2d(cls, module: nn.MaxPool2d) -> BlurMaxPool2d:
        """The anti-aliased version of `module`."""
        if module.return_indices:
            raise ValueError("BlurPool cannot replace a MaxPool2d with return_indices=True")
        return cls(
            module.kernel_size, module.stride, module.padding, module.dilation, module.ceil_mode
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blurmax_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil_mode,
            self.filt2d,
        )


class BlurConv2d(nn.Module):
    """A strided `Conv2d` with a blur before (`blur_first`) or instead of its downsampling.

    Attributes:
        conv: the convolution (weights copied from the replaced module).
        blur_filter: `(C, 1, 3, 3)` binomial filter buffer.
        blur_stride: the blur's stride: 1 before the conv, the conv's stride after it.
    """

    def __init__(self, conv: nn.Conv2d, blur_first: bool = True):
        super().__init__()
        self.blur_first = blur_first
        if blur_first:
            self.blur_stride = 1
            blur_channels = conv.in_channels
        else:  # run the conv densely and let the blur downsample
            self.blur_stride = conv.stride
            conv.stride = (1, 1)
            blur_channels = conv.out_channels
        self.conv = conv
        self.register_buffer("blur_filter", binomial_filter_2d().repeat(blur_channels, 1, 1, 1))

    @classmethod
    def from_conv2d(cls, module: nn.Conv2d, blur_first: bool = True) -> BlurConv2d:
        """A `BlurConv2d` holding a copy of `module` (same weights, bias and options)."""
        conv = nn.Conv2d(
            module.in_channels,
            module.out_channels,
            module.kernel_size,
            stride=module.stride,
            padding=module.padding,
            dilation=module.dilation,
            groups=module.groups,
            bias=module.bias is not None,
            padding_mode=module.padding_mode,
            device=module.weight.device,
            dtype=module.weight.dtype,
        )
        with torch.no_grad():
            conv.weight.copy_(module.weight)
            if module.bias is not None:
                conv.bias.copy_(module.bias)
        conv.weight.requires_grad_(module.weight.requires_grad)
        return cls(conv, blur_first=blur_first)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(blur_2d(x, stride=self.blur_stride, filter=self.blur_filter))
        return blur_2d(self.conv(x), stride=self.blur_stride, filter=self.blur_filter)


def apply_blurpool(
    model: nn.Module,
    replace_convs: bool = True,
    replace_maxpools: bool = True,
    blur_first: bool = True,
    min_channels: int = 16,
    optimizers: Any = None,
) -> nn.Module:
    """A copy of `model` with strided convolutions and max-pools anti-aliased.

    Args:
        model: the model (not modified).
        replace_convs: replace `Conv2d`s with a stride > 1 and `in_channels >= min_channels`.
        replace_maxpools: replace every `MaxPool2d`.
        blur_first: blur before the strided conv (cheap) or after a stride-1 conv (as in the paper).
        min_channels: skip convolutions with fewer input channels (the stem, usually).
    Returns:
        the new model; warns when nothing was replaced.
    """
    check_module(model, "apply_blurpool")
    reject_optimizers("apply_blurpool", optimizers)
    count = 0

    def policy(name: str, module: nn.Module):
        nonlocal count
        if replace_maxpools and isinstance(module, nn.MaxPool2d):
            count += 1
            return BlurMaxPool2d.from_maxpool2d(module)
        if (
            replace_convs
            and type(module) is nn.Conv2d
            and max(_as_pair(module.stride)) > 1
            and module.in_channels >= min_channels
        ):
            count += 1
            return BlurConv2d.from_conv2d(module, blur_first=blur_first)
        return None

    new = replace_modules(model, policy)
    if count == 0:
        warnings.warn(
            "apply_blurpool changed nothing: no MaxPool2d and no strided Conv2d with "
            f">= {min_channels} input channels was found",
            stacklevel=2,
        )
    return new
