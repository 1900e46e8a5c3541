"""Progressive resizing (fast.ai): train on smaller images early, full-size images at the end.

Composer's semantics: the scale stays at `initial_scale` for the first `delay_fraction` of training,
grows linearly to 1 by the start of the last `finetune_fraction`, and stays at 1. The width is then
pinned to a multiple of `size_increment`. `resize_batch` shrinks a batch by nearest-neighbour
interpolation ("resize") or by one random crop shared by the whole batch ("crop").

Example:
    >>> round(progressive_scale(0.6, initial_scale=0.5, finetune_fraction=0.2, delay_fraction=0.5), 4)
    0.6667
    >>> resize_batch(torch.zeros(2, 3, 8, 8), torch.zeros(2), 0.5)[0].shape
    torch.Size([2, 3, 4, 4])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .sampling import randint, require_generator
from .targets import check_for_index_targets

MODES = ("crop", "resize")


def progressive_scale(
    elapsed_fraction: float,
    initial_scale: float = 0.5,
    finetune_fraction: float = 0.2,
    delay_fraction: float = 0.5,
) -> float:
    """The (unpinned) scale factor after `elapsed_fraction` of training.

    Args:
        elapsed_fraction: the fraction of training done, in [0, 1].
        initial_scale: the starting scale, in [0, 1].
        finetune_fraction: the final fraction trained at full size.
        delay_fraction: the initial fraction trained at `initial_scale`.
    Returns:
        a scale in `[initial_scale, 1]`.
    """
    ramp = 1 - finetune_fraction - delay_fraction
    if elapsed_fraction < delay_fraction:
        progress = 0.0
    elif ramp <= 0:  # no ramp left: jump to full size (Composer would divide by zero)
        progress = 1.0
    else:
        progress = min((elapsed_fraction - delay_fraction) / ramp, 1.0)
    return initial_scale + (1 - initial_scale) * progress


def pin_scale(width: int, scale_factor: float, size_increment: int) -> float:
    """`scale_factor` adjusted so that `width * scale` is a multiple of `size_increment` (>= one)."""
    if size_increment < 1:
        raise ValueError(f"size_increment must be >= 1, got {size_increment}")
    pinned = round(width * scale_factor / size_increment) * size_increment
    # Composer lets this reach 0 (a crash in interpolate); the smallest valid size is one increment.
    return max(pinned, min(size_increment, width)) / width


def _crop_offsets(size: int, cropped: int, generator) -> int:
    # Composer draws torch.randint(size - cropped): offsets 0 .. size - cropped - 1.
    if size - cropped <= 0:
        return 0
    return randint(0, size - cropped, generator)


def resize_batch(
    input: torch.Tensor,
    target: Any,
    scale_factor: float,
    mode: str = "resize",
    resize_targets: bool = False,
    *,
    generator: torch.Generator | None = None,
    crop_offset: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, Any]:
    """Shrink images (and optionally dense targets) by `scale_factor`.

    Args:
        input: `(N, C, H, W)` images.
        target: targets; resized only when `resize_targets` (then `(N, H, W)` or `(N, C, H, W)`).
        scale_factor: in (0, 1]; >= 1 returns the batch unchanged.
        mode: "resize" (nearest-neighbour) or "crop" (one random crop for the whole batch).
        resize_targets: also resize/crop the targets (segmentation).
        generator: the source of the crop's corner (top, then left) when `crop_offset` is None.
        crop_offset: an explicit `(top, left)` corner for "crop" mode.
    Returns:
        `(input_resized, target_resized_or_unchanged)`.
    """
    if mode not in MODES:
        raise ValueError(f"progressive resizing mode must be one of {MODES}, got {mode!r}")
    if input.dim() < 3:
        raise ValueError(f"resize_batch expects images (N, C, H, W), got {tuple(input.shape)}")
    if resize_targets and (not isinstance(target, torch.Tensor) or target.dim() < 3):
        raise ValueError("resize_targets=True needs image-shaped targets (N, H, W) or (N, C, H, W)")
    if scale_factor >= 1:
        return input, target
    if scale_factor <= 0:
        raise ValueError(f"scale_factor must be positive, got {scale_factor}")

    index_targets = resize_targets and check_for_index_targets(target)
    y = target.float().unsqueeze(1) if index_targets else target
    if mode == "resize":

        def shrink(t: torch.Tensor) -> torch.Tensor:
            return F.interpolate(
                t, scale_factor=scale_factor, mode="nearest", recompute_scale_factor=False
            )

        new_input = shrink(input)
        if resize_targets:
            y = shrink(y)
    else:
        height, width = input.shape[-2], input.shape[-1]
        crop_h, crop_w = int(scale_factor * height), int(scale_factor * width)
        if crop_offset is None:
            gen = require_generator(generator, "progressive resizing's crop")
            crop_offset = (_crop_offsets(height, crop_h, gen), _crop_offsets(width, crop_w, gen))
        top, left = crop_offset
        new_input = input[..., top : top + crop_h, left : left + crop_w]
        if resize_targets:
            # The same region of the target, in the target's own resolution.
            th, tw = int(scale_factor * y.shape[-2]), int(scale_factor * y.shape[-1])
            ttop = int(y.shape[-2] / height * top)
            tleft = int(y.shape[-1] / width * left)
            y = y[..., ttop : ttop + th, tleft : tleft + tw]
    if index_targets:
        y = y.squeeze(1).to(target.dtype)
    return new_input, y
