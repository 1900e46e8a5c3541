"""`lr_find`: Smith's learning-rate range test, as Lightning's `Tuner.lr_find` runs it.

The test trains a fresh state for up to `num_steps` batches while the learning rate grows
exponentially from `min_lr` to `max_lr`, records the loss of every batch, smooths it (an
exponential moving average with bias correction, `smoothing` = 0.98 as in fastai and Lightning)
and stops early once the smoothed loss exceeds `divergence` times its best value (or is not
finite). The suggested learning rate is where the smoothed loss falls fastest against
log(lr) -- the steepest descent of the curve, skipping the first `skip_start` points and the last
one, as Lightning's suggestion does.

The model is not changed: the test trains copies of its parameters (`fit(..., donate=False)`).
`result.save(path)` writes the curve as JSON and `python -m functrain.plot lr_find.json` draws it.

Example:
    >>> result = lr_find(model, loss_fn, lambda lr: functrain.optim.adamw(lr), loader)
    >>> result.suggestion  # the digits CNN of examples/digits_cnn.py, AdamW
    0.0206...
    >>> result.save("runs/lr_find.json")  # then: python -m functrain.plot runs/lr_find.json
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["LRFindResult", "lr_find", "steepest_descent", "KIND", "DEFAULT_FILE_NAME"]

KIND = "functrain.lr_find"  # the JSON file's "kind", which `functrain.plot` recognises
DEFAULT_FILE_NAME = "lr_find.json"  # what `python -m functrain.plot RUN_DIR` looks for


def steepest_descent(losses: list[float], skip_start: int = 10, skip_end: int = 1) -> int | None:
    """The index where `losses` (equally spaced in log lr) fall fastest, or None if too short.

    Args:
        losses: the smoothed losses, one per learning rate.
        skip_start: points left out at the start (the first steps move little and noisily).
        skip_end: points left out at the end (the last one is often the divergence).
    Returns:
        the index into `losses` of the most negative gradient; None with fewer than 3 finite
        points left.
    Example:
        >>> steepest_descent([5, 5, 4.9, 4.0, 2.0, 1.5, 1.4, 9.0], skip_start=1)
        3
    """
    window = np.asarray(losses[skip_start : len(losses) - skip_end], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(window))
    if bad.size:
        window = window[: bad[0]]  # the curve ends where the loss stopped being a number
    if window.size < 3:
        return None
    return skip_start + int(np.gradient(window).argmin())


@dataclasses.dataclass
class LRFindResult:
    """The range test's curve and suggestion.

    Attributes:
        lrs: the learning rate of each step taken.
        losses: each step's loss (as the step reported it).
        smoothed: the smoothed loss after each step.
        suggestion: the suggested learning rate (None when the curve is too short).
        suggestion_index: its index into `lrs`.
        stop_reason: why the test stopped early (None: it ran all `num_steps`).
        min_lr, max_lr, num_steps: the sweep asked for.
    """

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestion: float | None
    suggestion_index: int | None
    stop_reason: str | None
    min_lr: float
    max_lr: float
    num_steps: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (non-finite losses as "nan"/"inf" strings) that `from_json` reads."""
        data = dataclasses.asdict(self)
        for key in ("losses", "smoothed"):
            data[key] = [v if math.isfinite(v) else str(v) for v in data[key]]
        return {"kind": KIND, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LRFindResult:
        """Rebuild a result from `to_json()`'s dict."""
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"not an lr_find result (its 'kind' is not {KIND!r})")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        for key in ("losses", "smoothed"):
            values[key] = [float(v) for v in values[key]]
        return cls(**values)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result as JSON to `path` (for `python -m functrain.plot path`)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> LRFindResult:
        """Read a result written by `save`."""
        return cls.from_json(json.loads(Path(path).read_text()))


class _Recorder:
    """The callback that records each step's loss, smooths it and stops on divergence."""

    def __init__(self, lr_at: Callable[[int], float], smoothing: float, divergence: float):
        self.lr_at, self.beta, self.divergence = lr_at, smoothing, divergence
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.smoothed: list[float] = []
        self.average, self.best = 0.0, math.inf
        self.stop_reason: str | None = None

    def batch_end(self, ctx: Any) -> None:
        loss = float(ctx.metrics["loss"])  # one device sync per step: the test needs every loss
        index = len(self.losses)
        lr = ctx.metrics.get("lr")  # the lr the optimizer used, read from its state
        self.lrs.append(float(lr) if isinstance(lr, (int, float)) else self.lr_at(index))
        self.losses.append(loss)
        if not math.isfinite(loss):
            self.smoothed.append(loss)
            self._stop(ctx, f"the loss became {loss} at lr {self.lrs[-1]:.3g}")
            return
        self.average = self.beta * self.average + (1 - self.beta) * loss
        smoothed = self.average / (1 - self.beta ** (index + 1))  # bias-corrected
        self.smoothed.append(smoothed)
        self.best = min(self.best, smoothed)
        if index > 0 and smoothed > self.divergence * self.best:
            self._stop(ctx, f"the loss diverged at lr {self.lrs[-1]:.3g}")

    def _stop(self, ctx: Any, reason: str) -> None:
        self.stop_reason = reason
        ctx.request_stop(f"lr_find: {reason}")


def lr_find(
    model: torch.nn.Module,
    loss_fn: Callable[..., Any],
    optimizer: Callable[[Any], Any],
    data: Any,
    *,
    min_lr: float = 1e-7,
    max_lr: float = 1.0,
    num_steps: int = 100,
    smoothing: float = 0.98,
    divergence: float = 4.0,
    skip_start: int = 10,
    seed: int = 0,
    init_options: dict[str, Any] | None = None,
    **step_options: Any,
) -> LRFindResult:
    """Run the learning-rate range test on a fresh state of `model` and suggest a learning rate.

    Args:
        model: the module (its parameters are copied, never changed).
        loss_fn: `(model, batch) -> loss`, as for `functrain.make_step`.
        optimizer: `lr -> Transform`, the optimizer with its learning rate given, e.g.
            `lambda lr: functrain.optim.adamw(lr, weight_decay=1e-4)`; it gets the sweep's
            schedule, so any other hyperparameter stays as in the real run.
        data: training batches (a `functrain.data.Loader` or any iterable; reiterated as
            epochs if it is shorter than `num_steps`).
        min_lr, max_lr: the sweep's first and last learning rates.
        num_steps: the number of steps of the sweep (fewer when the loss diverges).
        smoothing: the moving average's weight of the past (0: no smoothing).
        divergence: stop once the smoothed loss is this many times its best.
        skip_start: points the suggestion ignores at the start.
        seed: the state's seed (dropout, data order of functrain loaders).
        init_options: more arguments of `functrain.init` (`mesh`, `plan`).
        **step_options: passed to `functrain.make_step` (precision, microbatches, ...).
    Returns:
        an `LRFindResult`: the curve, the suggestion, why it stopped.
    Example:
        >>> lr_find(model, loss_fn, lambda lr: sgd(lr, momentum=0.9), loader).suggestion
    """
    from ..schedules import exponential
    from ..state import init
    from ..step.make import make_step
    from .api import fit

    if not (0 < min_lr < max_lr and math.isfinite(max_lr)):
        raise ValueError(f"lr_find needs 0 < min_lr < max_lr, got min_lr={min_lr}, max_lr={max_lr}")
    if num_steps < 2:
        raise ValueError(f"num_steps must be >= 2 (a sweep needs two points), got {num_steps}")
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1) (0.98 is usual), got {smoothing}")
    if divergence <= 1:
        raise ValueError(
            f"divergence must be > 1 (stop at that many times the best), got {divergence}"
        )
    schedule = min_lr * exponential(max_lr / min_lr, decay_period=f"{num_steps - 1}ba")
    transform = optimizer(schedule)
    state = init(model, transform, seed=seed, **(init_options or {}))
    step = make_step(model, loss_fn, transform, **step_options)
    recorder = _Recorder(lambda i: schedule(i), smoothing, divergence)
    fit(step, state, data, duration=f"{num_steps}ba", callbacks=[recorder], log_interval=None,
        donate=False, progress=False)  # fmt: skip
    index = steepest_descent(recorder.smoothed, skip_start=skip_start)
    return LRFindResult(
        lrs=recorder.lrs,
        losses=recorder.losses,
        smoothed=recorder.smoothed,
        suggestion=None if index is None else recorder.lrs[index],
        suggestion_index=index,
        stop_reason=recorder.stop_reason,
        min_lr=float(min_lr),
        max_lr=float(max_lr),
        num_steps=int(num_steps),
    )
