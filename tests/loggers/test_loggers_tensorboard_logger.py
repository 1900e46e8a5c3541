"""TensorBoardLogger: event files that TensorBoard's own reader loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from functrain.loggers import TensorBoardLogger

pytest.importorskip("tensorboard")


def _accumulator(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_images_and_hparams_read_back(make_ctx, tmp_path):
    logger = TensorBoardLogger()
    logger.fit_start(make_ctx(run_dir=str(tmp_path)))
    for step in (10, 20, 30):
        logger.log_metrics({"train/loss": torch.tensor(1.0 / step), "train/lr": 0.1}, step=step)
    grid = np.zeros((12, 20, 3), dtype=np.uint8)
    grid[:, :10, 0] = 255
    logger.log_images("images/train", grid, step=30)
    logger.log_hparams({"lr": 0.1, "layers": 3})
    logger.close()

    acc = _accumulator(tmp_path / "tensorboard")
    tags = acc.Tags()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [10, 20, 30]
    assert [e.value for e in loss] == pytest.approx([0.1, 0.05, 1 / 30])
    assert "images/train" in tags["images"]
    (image,) = acc.Images("images/train")
    assert (image.width, image.height, image.step) == (20, 12, 30)
    assert any("hparams" in tag for tag in tags["tensors"])  # text summaries are tensors


def test_other_ranks_write_nothing_unless_asked(make_ctx, tmp_path):
    quiet = TensorBoardLogger(tmp_path / "a")
    quiet.fit_start(make_ctx(rank=1))
    quiet.log_metrics({"loss": 1.0}, step=1)
    quiet.close()
    assert not (tmp_path / "a").exists()

    loud = TensorBoardLogger(tmp_path / "b", all_ranks=True)
    loud.fit_start(make_ctx(rank=1))
    loud.log_metrics({"loss": 1.0}, step=1)
    loud.close()
    assert [e.value for e in _accumulator(tmp_path / "b" / "rank1").Scalars("loss")] == [1.0]


def test_no_directory_fails_at_the_start(make_ctx):
    with pytest.raises(ValueError, match="log_dir"):
        TensorBoardLogger().fit_start(make_ctx())
