"""What every logger shares: rank-0 gating and the one place tensors become floats.

A logger is a callback (it may handle loop events) that also has `log_metrics(metrics, step)`. The
loop calls `ctx.log(...)` only on logging steps, and `log_metrics` is where device tensors turn
into Python floats -- all of a call's scalars in one transfer per device -- so a step that is not
logged never waits for the device.

Example:
    >>> to_floats({"loss": torch.tensor(0.5), "lr": 1e-3, "grad_norms": {"fc.weight": 2.0}})
    {'loss': 0.5, 'lr': 0.001, 'grad_norms/fc.weight': 2.0}
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def process_rank() -> int:
    """This process's global rank (0 without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def _flatten(metrics: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _flatten(value, f"{name}/", out)
        else:
            out[name] = value


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Scalar metrics as Python floats; nested dicts flatten to "outer/inner" keys.

    Tensors with one element are kept (all 0-d tensors of a device move to the host in one
    transfer); larger tensors (model outputs), strings and None are dropped.

    Args:
        metrics: `{name: tensor | number | bool | None | nested dict}`.
    Returns:
        `{name: float}` in the order of `metrics`.
    """
    flat: dict[str, Any] = {}
    _flatten(metrics, "", flat)
    out: dict[str, float | None] = {}
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for key, value in flat.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            if hasattr(value, "full_tensor"):  # a DTensor scalar
                replicated = all(p.is_replicate() for p in value.placements)
                # Replicated: the local copy is the value (no communication). Otherwise
                # full_tensor() is a collective, so such a metric must be logged on every rank.
                value = value.to_local() if replicated else value.full_tensor()
            out[key] = None  # filled below, keeping the key order
            by_device.setdefault(value.device, []).append((key, value.detach().reshape(())))
        elif isinstance(value, (bool, int, float, np.number, np.bool_)):
            out[key] = float(value)
        elif isinstance(value, np.ndarray) and value.size == 1:
            out[key] = float(value.reshape(()))
    for items in by_device.values():
        # One device-to-host copy per device: the only synchronisation of a logging step.
        values = torch.stack([t.to(torch.float64) for _, t in items]).tolist()
        for (key, _), number in zip(items, values):
            out[key] = number
    return {k: v for k, v in out.items() if v is not None}


def import_optional(module: str, install_hint: str) -> Any:
    """Import a logger's backend (an optional dependency) when it is first used.

    Args:
        module: the module's dotted name, e.g. "torch.utils.tensorboard".
        install_hint: the error message when it is missing: what to install.
    Returns:
        the module.
    Raises:
        ImportError: with `install_hint`, when the module cannot be imported.
    Example:
        >>> import_optional("mlflow.tracking", "pip install mlflow-skinny").MlflowClient
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(install_hint) from error


def json_number(value: float) -> float | str:
    """`value`, or "nan" / "inf" / "-inf" so that a log stays strict JSON."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


class Logger:
    """Base class for loggers: rank-0 gating and float conversion.

    Subclasses implement `write_metrics(values: dict[str, float], step: int)` and optionally
    `write_hparams`, `write_images`, `close`. Event methods a subclass defines should call
    `self.observe(ctx)` first so the logger knows its rank.

    Args:
        all_ranks: log on every rank, not only on rank 0.
    """

    def __init__(self, *, all_ranks: bool = False):
        self.all_ranks = all_ranks
        self._rank: int | None = None

    def observe(self, ctx: Any) -> bool:
        """Remember the rank from a loop context; True when this logger is active."""
        rank = getattr(ctx, "rank", None)
        if rank is not None:
            self._rank = int(rank)
        return self.active

    @property
    def rank(self) -> int:
        """The rank this logger runs on (from the last context seen, else torch.distributed)."""
        return self._rank if self._rank is not None else process_rank()

    @property
    def active(self) -> bool:
        """Whether this process writes (rank 0, or every rank with `all_ranks=True`)."""
        return self.all_ranks or self.rank == 0

    def init(self, ctx: Any) -> None:
        self.observe(ctx)

    def fit_start(self, ctx: Any) -> None:
        self.observe(ctx)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record `metrics` at `step` (tensors become floats here, on active ranks only)."""
        if not self.active:
            return
        values = to_floats(metrics)
        if values:
            self.write_metrics(values, int(step))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters (plain values; others are shown by `repr`)."""
        if self.active:
            self.write_hparams(dict(hparams))

    def log_images(self, name: str, images: Any, step: int) -> None:
        """Record images: `(N, H, W, C)` or `(H, W, C)`, uint8 or floats in [0, 1]."""
        if self.active:
            self.write_images(name, as_uint8_nhwc(images), int(step))

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement write_metrics")

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        """Loggers without a place for hyperparameters ignore them."""

    def write_images(self, name: str, images: np.ndarray, step: int) -> None:
        """Loggers without a place for images ignore them."""

    def close(self) -> None:
        """Release files and connections (safe to call twice)."""


def as_uint8_nhwc(images: Any) -> np.ndarray:
    """Images as a uint8 array of shape `(N, H, W, C)` with C in {1, 3, 4}.

    Args:
        images: a tensor or array `(N, H, W, C)`, `(H, W, C)` or `(H, W)`; uint8, or floats in
            [0, 1].
    Returns:
        the uint8 array.
    """
    if isinstance(images, torch.Tensor):
        images = images.detach().cpu().numpy()
    array = np.asarray(images)
    if array.ndim == 2:
        array = array[None, :, :, None]
    elif array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(
            f"images must be (N, H, W, C), (H, W, C) or (H, W) with C in 1, 3, 4 (channels "
            f"last); got shape {tuple(np.shape(images))}. Permute channels-first images with "
            "x.permute(0, 2, 3, 1)"
        )
    if array.dtype != np.uint8:
        array = (np.clip(array.astype(np.float64), 0.0, 1.0) * 255.0).round().astype(np.uint8)
    return array
