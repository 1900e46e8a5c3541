"""`ImageVisualizer`: a grid of input images titled with their targets and the model's predictions.

Every `interval` (training) or at each evaluation's first batch, the first `num_images` inputs of
the batch are drawn with matplotlib (Agg, no display needed), each titled "y=<target>" and
"p=<prediction>" (green when right, red when wrong). The grid is written as a PNG under
`RUN_DIR/images/` and sent to every logger that has `log_images` (TensorBoard, MLflow).

Predictions come from `predict_fn(state, inputs)` when given (e.g. the step's
`pieces.call_model`), else from the loop: in training the step's metrics (`ctx.metrics["outputs"]`,
for a `loss_fn` that returns `(loss, {"outputs": logits})`), in evaluation `ctx.outputs`. Logits
become class indices by argmax; without predictions, only targets are shown.

Example:
    >>> viz = ImageVisualizer(interval="1ep", on_eval=True, predict_fn=step.pieces.call_model,
    ...                       class_names=[str(d) for d in range(10)])
    >>> functrain.fit(step, state, loader, duration="3ep", callbacks=[viz])  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..units import TimeLike
from .interval import Trigger


def _get(batch: Any, key: Any) -> Any:
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as error:
        raise KeyError(
            f"ImageVisualizer cannot take {key!r} from a batch of type {type(batch).__name__}; "
            "set input_key= / target_key= to where the images and targets are"
        ) from error


def _to_hwc(images: torch.Tensor, channels_last: bool) -> np.ndarray:
    """`(N, H, W, C)` floats in [0, 1], each image min-max scaled (inputs are often normalised)."""
    x = images.detach().float().cpu()
    if x.ndim == 3:  # (N, H, W): grayscale
        x = x[:, None] if not channels_last else x[..., None]
    if x.ndim != 4:
        raise ValueError(
            f"ImageVisualizer needs image inputs (N, C, H, W), (N, H, W, C) or (N, H, W); got "
            f"shape {tuple(images.shape)}"
        )
    if not channels_last:
        x = x.permute(0, 2, 3, 1)
    low = x.amin(dim=(1, 2, 3), keepdim=True)
    high = x.amax(dim=(1, 2, 3), keepdim=True)
    x = (x - low) / (high - low).clamp_min(1e-12)
    return x.numpy()


def _labels(values: Any, count: int) -> list[Any] | None:
    if values is None:
        return None
    values = torch.as_tensor(values).detach().cpu()
    if values.ndim == 2 and values.is_floating_point():  # logits or one-hot/soft targets
        values = values.argmax(dim=-1)
    if values.ndim != 1:
        return None  # not per-image labels (e.g. segmentation maps): not shown
    return values[:count].tolist()


def render_grid(
    images: np.ndarray,
    targets: Sequence[Any] | None = None,
    predictions: Sequence[Any] | None = None,
    class_names: Sequence[str] | None = None,
    columns: int = 8,
) -> np.ndarray:
    """Draw images in a titled grid and return it as an RGB uint8 array `(H, W, 3)`.

    Args:
        images: `(N, H, W, C)` floats in [0, 1], C = 1 or 3.
        targets: per-image targets (class indices or any printable value).
        predictions: per-image predictions, compared with the targets for the title colour.
        class_names: names for class indices.
        columns: images per row.
    Returns:
        the rendered grid.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def name(value: Any) -> str:
        if class_names is not None and isinstance(value, int) and 0 <= value < len(class_names):
            return str(class_names[value])
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    count = len(images)
    columns = max(1, min(columns, count))
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(1.6 * columns, 1.9 * rows), dpi=100)
    FigureCanvasAgg(figure)
    for index in range(count):
        axes = figure.add_subplot(rows, columns, index + 1)
        image = images[index]
        if image.shape[-1] == 1:
            axes.imshow(image[..., 0], cmap="gray", vmin=0.0, vmax=1.0)
        else:
            axes.imshow(image)
        axes.set_xticks([])
        axes.set_yticks([])
        lines, colour = [], "black"
        if targets is not None:
            lines.append(f"y={name(targets[index])}")
        if predictions is not None:
            lines.append(f"p={name(predictions[index])}")
            if targets is not None:
                colour = "green" if predictions[index] == targets[index] else "red"
        axes.set_title("  ".join(lines), fontsize=8, color=colour)
    # Fixed margins (room for one title line per row): tight_layout costs ~0.5 s a grid.
    top_margin = 0.3 / (1.9 * rows)
    figure.subplots_adjust(
        left=0.02, right=0.98, bottom=0.02, top=1 - top_margin, wspace=0.08, hspace=0.35
    )
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()  # type: ignore[attr-defined]  # Agg


class ImageVisualizer:
    """Log a grid of inputs with targets and predictions, as PNG files and to image loggers.

    Args:
        interval: how often during training ("100ba", "1ep"); None: never during training.
        on_eval: also draw the first batch of every evaluation.
        num_images: images in the grid.
        input_key / target_key: where images and targets are in a batch (index or dict key).
        predict_fn: `(state, inputs) -> outputs` (logits or labels), e.g.
            `step.pieces.call_model`; None: training grids use `ctx.metrics["outputs"]` and
            evaluation grids `ctx.outputs` (the loop's eval outputs) when present.
        class_names: names shown instead of class indices.
        channels_last: the images are `(N, H, W, C)` rather than `(N, C, H, W)`.
        out_dir: where PNGs go; None: `RUN_DIR/images` (no files without a run directory).
        name: the image tag ("images/train", "images/eval" are derived from it).
    """

    def __init__(
        self,
        interval: TimeLike | None = "100ba",
        *,
        on_eval: bool = False,
        num_images: int = 8,
        input_key: Any = 0,
        target_key: Any = 1,
        predict_fn: Callable[[Any, Any], Any] | None = None,
        class_names: Sequence[str] | None = None,
        channels_last: bool = False,
        out_dir: str | os.PathLike | None = None,
        name: str = "images",
    ):
        if num_images < 1:
            raise ValueError(f"ImageVisualizer num_images must be >= 1, got {num_images}")
        self.interval = Trigger(interval) if interval is not None else None
        self.on_eval = on_eval
        self.num_images = num_images
        self.input_key, self.target_key = input_key, target_key
        self.predict_fn = predict_fn
        self.class_names = class_names
        self.channels_last = channels_last
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.name = name
        self.written: list[Path] = []  # PNG files written so far
        self._eval_drawn = True

    def _draw(self, ctx: Any, phase: str, outputs: Any) -> None:
        if getattr(ctx, "rank", 0) != 0:
            return
        inputs = _get(ctx.batch, self.input_key)[: self.num_images]
        targets = _labels(_get(ctx.batch, self.target_key), len(inputs))
        if self.predict_fn is not None:
            with torch.no_grad():
                outputs = self.predict_fn(ctx.state, inputs)
        predictions = _labels(outputs, len(inputs)) if outputs is not None else None
        grid = render_grid(
            _to_hwc(inputs, self.channels_last), targets, predictions, self.class_names
        )
        step = int(ctx.timestamp.batch)  # the x-axis ctx.log uses
        tag = f"{self.name}/{phase}"
        out_dir = self.out_dir
        if out_dir is None and getattr(ctx, "run_dir", None) is not None:
            out_dir = Path(ctx.run_dir) / "images"
        if out_dir is not None:
            from matplotlib.image import imsave

            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{self.name}_{phase}_step{step:08d}.png"
            imsave(path, grid)
            self.written.append(path)
        for logger in getattr(ctx, "loggers", None) or ():
            if hasattr(logger, "log_images"):
                logger.log_images(tag, grid, step)

    def batch_end(self, ctx: Any) -> None:
        if self.interval is not None and self.interval.due(ctx.timestamp):
            self._draw(ctx, "train", (ctx.metrics or {}).get("outputs"))

    def eval_start(self, ctx: Any) -> None:
        self._eval_drawn = not self.on_eval

    def eval_batch_end(self, ctx: Any) -> None:
        if not self._eval_drawn:
            self._eval_drawn = True
            # Not ctx.metrics: those belong to the last *training* step.
            self._draw(ctx, "eval", getattr(ctx, "outputs", None))
