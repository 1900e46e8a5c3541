"""ImageVisualizer: a titled grid of real digits, written as PNG and sent to image loggers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from functrain.callbacks import ImageVisualizer, render_grid


@pytest.fixture(scope="module")
def digits_batch():
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images[:16], dtype=torch.float32)[:, None]  # (N, 1, 8, 8)
    targets = torch.tensor(data.target[:16])
    return images, targets


def _logits_for(labels, classes=10):
    return torch.nn.functional.one_hot(labels, classes).float() * 5.0


def test_training_grid_from_step_outputs(make_ctx, advance, recorder, digits_batch, tmp_path):
    images, targets = digits_batch
    wrong = targets.clone()
    wrong[:3] = (wrong[:3] + 1) % 10  # three mistakes
    ctx = make_ctx(loggers=[recorder], run_dir=str(tmp_path))
    ctx.batch = (images, targets)
    viz = ImageVisualizer(interval="2ba", num_images=8)
    viz.batch_end(advance(ctx, outputs=_logits_for(wrong)))
    assert viz.written == [] and recorder.images == []
    viz.batch_end(advance(ctx, outputs=_logits_for(wrong)))
    (path,) = viz.written
    assert path == tmp_path / "images" / "images_train_step00000002.png"
    png = imread(path)
    assert png.shape[0] > 100 and png.shape[1] > 400  # a grid of 8 titled images
    assert png[..., :3].std() > 0.05  # not blank
    ((name, grid, step),) = recorder.images
    assert name == "images/train" and step == 2
    assert grid.dtype == np.uint8 and grid.ndim == 3 and grid.shape[-1] == 3


def test_title_colours_mark_mistakes(digits_batch):
    images = digits_batch[0][:2, 0, :, :, None].numpy() / 16.0
    right = render_grid(images, targets=[1, 2], predictions=[1, 2])
    wrong = render_grid(images, targets=[1, 2], predictions=[1, 3])

    def red(grid):
        r, g, b = (grid[..., i].astype(int) for i in range(3))
        return int(((r > 150) & (g < 80) & (b < 80)).sum())

    def green(grid):
        r, g, b = (grid[..., i].astype(int) for i in range(3))
        return int(((g > 80) & (r < 60) & (b < 60)).sum())

    assert red(right) == 0 and green(right) > 0
    assert red(wrong) > 0


def test_eval_grid_uses_predict_fn(make_ctx, recorder, digits_batch, tmp_path):
    images, targets = digits_batch
    calls = []

    def predict_fn(state, inputs):
        calls.append(inputs.shape)
        return _logits_for(torch.zeros(len(inputs), dtype=torch.long))

    ctx = make_ctx(loggers=[recorder])
    viz = ImageVisualizer(
        interval=None, on_eval=True, num_images=4, predict_fn=predict_fn, out_dir=tmp_path
    )
    for _ in range(2):  # two evaluations, three batches each: one grid per evaluation
        viz.eval_start(ctx)
        for _ in range(3):
            ctx.batch = (images, targets)
            viz.eval_batch_end(ctx)
    assert calls == [torch.Size([4, 1, 8, 8])] * 2
    assert [name for name, _, _ in recorder.images] == ["images/eval", "images/eval"]
    assert len(set(viz.written)) == 1  # same step: the second grid replaced the first file


def test_dict_batches_channels_last_and_eval_outputs(make_ctx, recorder, tmp_path):
    rgb = torch.rand(6, 5, 7, 3)  # (N, H, W, C)
    ctx = make_ctx(loggers=[recorder], run_dir=str(tmp_path))
    ctx.batch = {"pixels": rgb, "label": torch.arange(6)}
    ctx.outputs = _logits_for(torch.arange(6), classes=6)  # the loop's eval outputs
    viz = ImageVisualizer(
        interval=None, on_eval=True, input_key="pixels", target_key="label", channels_last=True,
        class_names=list("abcdef"),
    )  # fmt: skip
    viz.eval_start(ctx)
    viz.eval_batch_end(ctx)
    assert len(viz.written) == 1 and imread(viz.written[0]).shape[-1] in (3, 4)


def test_clear_errors(make_ctx, digits_batch):
    ctx = make_ctx()
    ctx.batch = {"x": torch.rand(2, 3, 4, 4)}
    viz = ImageVisualizer(interval="1ba")
    with pytest.raises(KeyError, match="input_key"):
        viz.batch_end(_step(ctx))
    ctx.batch = (torch.rand(2, 5), torch.zeros(2))
    with pytest.raises(ValueError, match=r"image inputs"):
        viz.batch_end(_step(ctx))
    with pytest.raises(ValueError, match="num_images"):
        ImageVisualizer(num_images=0)


def _step(ctx):
    state = ctx.state
    ctx.state = state.replace(timestamp=state.timestamp.advance_batch(2))
    return ctx
