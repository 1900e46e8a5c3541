"""Changed targets for any loss function: the shared machinery of label smoothing, MixUp and CutMix.

These methods train on targets that are not the batch's own: a smoothed target, or a mix of a
sample's target with another sample's. The user's `loss_fn(model, batch)` only knows the batch's
targets, so a method's `prepare` piece puts a *marker* in the target slot, and its `loss` piece
resolves the markers by calling the inner loss again with plain targets:

- `MixedTarget(original, permuted, original_weight, permuted_weight, interpolate_loss)`:
  with `interpolate_loss=True` the loss is `ow * loss(original) + pw * loss(permuted)`, which
  works for any loss (also one that takes only class indices) and equals training on the mixed
  targets for losses linear in the targets (cross-entropy); with `interpolate_loss=False` (Composer's
  default) the loss sees the dense mixed targets `ow * onehot(original) + pw * onehot(permuted)`.
- `SmoothedTarget(target, smoothing)`: the loss sees Composer's smoothed dense targets.

Markers nest (MixUp of CutMix of smoothed targets, in any list order) and are pytrees, so
microbatching splits them with the batch. The model is called through `functrain.step.model_calls.
ModelCalls`: the first run of the loss (with the original targets) records its model calls, and
each later run replays them in order when it passes the same tensors (`model(batch[0])`), so the
forward runs once however many loss terms there are. The first run uses the original targets, so
the `aux` metrics (accuracy, ...) are computed against them.

Losses on dense targets need a `loss_fn` that accepts class probabilities shaped like the outputs
(`F.cross_entropy` does), exactly as Composer requires; when yours takes only indices, use
`interpolate_loss=True` (MixUp, CutMix).

Example:
    >>> loss = resolving_loss(inner_loss, target_key=1)   # inside an algorithm's apply
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..functional.batch import get_item, set_item
from ..functional.label_smoothing import smooth_labels
from ..functional.targets import ensure_targets_one_hot
from ..step.model_calls import ModelCalls


class MixedTarget(NamedTuple):
    """A target mixed from two: `original_weight * original + permuted_weight * permuted`.

    Weights are Python numbers or 0-d tensors (see `mixing_weight`).
    """

    original: Any
    permuted: Any
    original_weight: float
    permuted_weight: float
    interpolate_loss: bool = False


class SmoothedTarget(NamedTuple):
    """A target smoothed towards the uniform distribution by `smoothing`."""

    target: Any
    smoothing: float


def is_marker(target: Any) -> bool:
    """True when `target` is a `MixedTarget` or `SmoothedTarget`."""
    return isinstance(target, (MixedTarget, SmoothedTarget))


def primary_target(target: Any) -> Any:
    """The batch's own target inside any nesting of markers."""
    while is_marker(target):
        target = target.original if isinstance(target, MixedTarget) else target.target
    return target


def check_plain_target(target: Any, algorithm: str) -> None:
    """Raise a clear error when an algorithm that needs the real targets finds a marker."""
    if is_marker(target):
        raise ValueError(
            f"{algorithm} needs the batch's own targets, but an earlier algorithm in the list "
            "(label_smoothing, mixup or cutmix) has already replaced them; list "
            f"{algorithm} before those algorithms in compose(...)"
        )


def dense_target(target: Any, outputs: torch.Tensor) -> torch.Tensor:
    """The dense (probability) target that a marker stands for, shaped like `outputs`."""
    if isinstance(target, MixedTarget):
        original = dense_target(target.original, outputs)
        permuted = dense_target(target.permuted, outputs)
        return target.original_weight * original + target.permuted_weight * permuted
    if isinstance(target, SmoothedTarget):
        return smooth_labels(outputs, dense_target(target.target, outputs), target.smoothing)
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"label-mixing algorithms need tensor targets, got {type(target).__name__}")
    # No range checks here: they would sync the device every step (the loss itself fails on
    # out-of-range classes anyway).
    return ensure_targets_one_hot(outputs, target, validate=False)


def loss_terms(target: Any, outputs_fn: Callable[[], torch.Tensor], weight=1.0) -> list:
    """`[(weight, plain_target), ...]` with `loss = sum(weight * inner_loss(plain_target))`."""
    if isinstance(target, MixedTarget) and target.interpolate_loss:
        return loss_terms(
            target.original, outputs_fn, weight * target.original_weight
        ) + loss_terms(target.permuted, outputs_fn, weight * target.permuted_weight)
    if is_marker(target):
        return [(weight, dense_target(target, outputs_fn()))]
    return [(weight, target)]


def _logits(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            "dense targets are shaped like the model's outputs, which must be a tensor or have "
            f"`logits`; got {type(outputs).__name__}. Use interpolate_loss=True instead"
        )
    return logits


def _is_number(weight: Any, value: float) -> bool:
    # Only Python numbers are tested: comparing a tensor weight would sync (and break compile).
    return isinstance(weight, (int, float)) and weight == value


def mixing_weight(value: float) -> torch.Tensor:
    """A mixing weight as a 0-d float32 tensor.

    A tensor rather than a Python float, so that a compiled step (`compile_step`) sees a new
    weight each step as data instead of recompiling for a new constant.
    """
    return torch.tensor(value, dtype=torch.float32)


def _call_with_target(inner, model, batch, target_key, plain, marker) -> torch.Tensor:
    """`inner`'s loss on the batch with target `plain`; a clear error if dense targets break it."""
    dense = (
        isinstance(plain, torch.Tensor) and plain is not primary_target(marker) and is_dense(marker)
    )
    try:
        loss, _ = inner(model, set_item(batch, target_key, plain))
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        if not dense:
            raise
        raise RuntimeError(
            f"loss_fn failed on dense (class-probability) targets of shape {tuple(plain.shape)}: "
            f"{error}. Label smoothing, and MixUp/CutMix with interpolate_loss=False (Composer's "
            "default), train on such targets, so loss_fn and the metrics it returns must accept "
            "them (F.cross_entropy does; for accuracy compare with targets.argmax(1) when "
            "targets.dim() == outputs.dim()). For MixUp/CutMix, interpolate_loss=True keeps the "
            "targets as they are and mixes the losses instead."
        ) from error
    return loss


def is_dense(target: Any) -> bool:
    """True when resolving `target` involves dense targets (not pure loss interpolation)."""
    if isinstance(target, MixedTarget) and target.interpolate_loss:
        return is_dense(target.original) or is_dense(target.permuted)
    return is_marker(target)


def resolving_loss(inner: Callable, target_key: Any) -> Callable:
    """Wrap a `loss(model, batch) -> (loss, aux)` piece so that target markers are resolved.

    Batches without markers go straight to `inner`. Otherwise `inner` is called first with the
    batch's own target (for `aux`, and to record the forward pass), then once per loss term.

    Args:
        inner: the loss piece being wrapped.
        target_key: where the target sits in the batch.
    Returns:
        the wrapped loss piece.
    """

    def loss(model, batch):
        target = get_item(batch, target_key)
        if not is_marker(target):
            return inner(model, batch)
        proxy = ModelCalls(model)
        primary = primary_target(target)
        primary_loss, aux = inner(proxy, set_item(batch, target_key, primary))
        terms = loss_terms(target, lambda: _logits(proxy.first_outputs()))
        total = None
        for weight, plain in terms:
            if _is_number(weight, 0):
                continue
            if plain is primary:
                term = primary_loss
            else:
                proxy.replay()
                term = _call_with_target(inner, proxy, batch, target_key, plain, target)
            term = term if _is_number(weight, 1) else weight * term
            total = term if total is None else total + term
        if total is None:  # every weight was zero
            total = primary_loss * 0.0
        return total, aux

    return loss
