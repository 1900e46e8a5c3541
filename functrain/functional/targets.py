"""Class targets as indices or as dense (one-hot / probability) tensors.

Loss functions such as `F.cross_entropy` accept either class indices (`(N,)` or `(N, d1, ...)`) or
class probabilities shaped like the logits (`(N, C)` or `(N, C, d1, ...)`). Label smoothing, MixUp
and CutMix produce probabilities, so they first make index targets dense, with the class dimension
at position 1 (Composer's `ensure_targets_one_hot` convention).

Example:
    >>> ensure_targets_one_hot(torch.zeros(2, 3), torch.tensor([2, 0]))
    tensor([[0., 0., 1.],
            [1., 0., 0.]])
"""

from __future__ import annotations

import warnings

import torch

INDEX_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_for_index_targets(targets: torch.Tensor) -> bool:
    """True when `targets` holds class indices (an integer dtype)."""
    return targets.dtype in INDEX_DTYPES


def infer_target_type(outputs: torch.Tensor, targets: torch.Tensor) -> str:
    """`"one_hot"` when `targets` is shaped like `outputs`, `"indices"` when it lacks the class dim.

    Raises:
        ValueError: when the shapes fit neither convention.
    """
    if outputs.shape == targets.shape:
        return "one_hot"
    if outputs.dim() == targets.dim() + 1:
        return "indices"
    raise ValueError(
        f"cannot tell whether targets of shape {tuple(targets.shape)} are class indices or class "
        f"probabilities for outputs of shape {tuple(outputs.shape)}: probabilities must have the "
        "outputs' shape, indices must lack the class dimension (outputs.dim() == targets.dim() + 1)"
    )


def one_hot(
    indices: torch.Tensor, num_classes: int, dim: int = 1, validate: bool = True
) -> torch.Tensor:
    """One-hot encode integer `indices`, inserting the class dimension at `dim`.

    Negative indices (an "ignore" label such as -100) become all-zero rows.

    Args:
        indices: an integer tensor.
        num_classes: the size of the class dimension.
        dim: where the class dimension goes (1: right after the batch dimension).
        validate: check the range of `indices` and warn about negative ones (Composer's checks);
            False skips them, which avoids a device-to-host sync inside a training step.
    Returns:
        a tensor of `indices.dtype` with one more dimension.
    """
    if not check_for_index_targets(indices):
        raise TypeError(f"one_hot expects integer class indices, got dtype {indices.dtype}")
    if validate and indices.numel():
        if int(indices.max()) >= num_classes:
            raise ValueError(
                f"class index {int(indices.max())} is out of range for {num_classes} classes; "
                "check that the model's output has one logit per class"
            )
        if bool((indices < 0).any()):
            warnings.warn(
                "negative class indices are treated as 'ignore' and encoded as all-zero rows",
                stacklevel=2,
            )
    # An extra class collects the negative indices and is dropped afterwards.
    work = torch.where(indices < 0, num_classes, indices.long())
    shape = list(work.unsqueeze(dim).shape)
    shape[dim] = num_classes + 1
    dense = torch.zeros(shape, dtype=indices.dtype, device=indices.device)
    dense.scatter_(dim, work.unsqueeze(dim), 1)
    return dense.narrow(dim, 0, num_classes)


def ensure_targets_one_hot(
    outputs: torch.Tensor,
    targets: torch.Tensor,
    num_classes: int | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """Dense float targets shaped like `outputs` (index targets are one-hot encoded at dim 1).

    Args:
        outputs: the model's logits, `(N, C)` or `(N, C, d1, ...)`.
        targets: class indices `(N,)` / `(N, d1, ...)`, or probabilities shaped like `outputs`.
        num_classes: the number of classes (default: `outputs.shape[1]`).
        validate: range-check index targets (see `one_hot`).
    Returns:
        float targets of `outputs`'s shape.
    Example:
        >>> ensure_targets_one_hot(torch.zeros(1, 2), torch.tensor([[0.3, 0.7]]))
        tensor([[0.3000, 0.7000]])
    """
    if infer_target_type(outputs, targets) == "indices":
        targets = one_hot(targets, num_classes or outputs.shape[1], dim=1, validate=validate)
    return targets.float()
