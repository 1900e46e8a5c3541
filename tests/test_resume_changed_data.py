"""A resume under a changed data definition (issue 30.8): the checkpoint records the data's
length, batch size and world size with its position, a mismatch is refused with both numbers
named, and `on_data_change` continues deliberately (restart the epoch, or convert by samples)
with the remaining epochs counted at the new length. A checkpoint without the record resumes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import functrain
from functrain.checkpoint import CheckpointError, Manager
from functrain.data import DataSource, Loader


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def dataset(n: int):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)
    )


def dataloader(n: int, batch_size: int):
    return torch.utils.data.DataLoader(dataset(n), batch_size=batch_size)


class StopAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            ctx.request_stop("test")


class Count:
    def __init__(self):
        self.batches = 0

    def batch_end(self, ctx):
        self.batches += 1


def fit(root, data, stop=None, **kwargs):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = functrain.optim.sgd(lr=0.01)
    step = functrain.make_step(model, mse, opt)
    count = Count()
    callbacks = [count] + ([StopAt(stop)] if stop else [])
    result = functrain.fit(
        step, functrain.init(model, opt, seed=0), data, duration="2ep", checkpoints=Manager(root),
        autoresume=True, callbacks=callbacks, return_result=True, progress=False, **kwargs,
    )  # fmt: skip
    return result, count.batches


def position(result):
    ts = result.state.timestamp
    return ts.epoch, ts.batch_in_epoch, ts.batch


@pytest.mark.filterwarnings("ignore:resuming DataLoader")
@pytest.mark.parametrize(
    "first, second, stop, named",
    [
        ((640, 16), (320, 16), 35, "num_samples: saved 640, now 320"),  # shrank mid-epoch
        ((640, 16), (600, 16), 35, "num_samples: saved 640, now 600"),  # a partial last batch
        (
            (640, 12),
            (640, 24),
            54,
            r"global batch size: saved 12 \(12 per rank x 1 ranks\), now 24",
        ),  # at an epoch end
    ],
)
def test_a_changed_definition_is_refused_naming_both_numbers_and_the_way_on(
    tmp_path, first, second, stop, named
):
    fit(tmp_path, dataloader(*first), stop=stop)
    with pytest.raises(CheckpointError, match=named) as caught:
        fit(tmp_path, dataloader(*second))
    assert "on_data_change='restart_epoch'" in str(caught.value)
    assert "on_data_change='by_samples'" in str(caught.value)


@pytest.mark.filterwarnings("ignore:resuming DataLoader")
@pytest.mark.parametrize(
    "first, second, stop, how, trained, end_batch",
    [
        # epoch 0 starts over on 20 batches, then epoch 1: 40 batches after the 35 trained
        ((640, 16), (320, 16), 35, "restart_epoch", 40, 75),
        # 560 samples trained cover the new epoch of 320: epoch 1 follows
        ((640, 16), (320, 16), 35, "by_samples", 20, 55),
        # 560 samples = batch 35 of 38 (600 samples): 3 batches of epoch 0, then 38
        ((640, 16), (600, 16), 35, "by_samples", 41, 76),
        # epoch 1 (not trained yet) at the new batch size: 27 batches of 24
        ((640, 12), (640, 24), 54, "restart_epoch", 27, 81),
    ],
)
def test_on_data_change_continues_deliberately_and_trains_every_remaining_epoch(
    tmp_path, first, second, stop, how, trained, end_batch
):
    fit(tmp_path, dataloader(*first), stop=stop)
    result, count = fit(tmp_path, dataloader(*second), on_data_change=how)
    assert result.finished
    assert count == trained
    assert position(result) == (2, 0, end_batch)


def test_an_unchanged_definition_resumes_as_before_with_a_loader(tmp_path):
    fit(tmp_path, Loader(dataset(64), 16, seed=1), stop=6)
    result, count = fit(tmp_path, Loader(dataset(64), 16, seed=1))
    assert (count, position(result), result.finished) == (2, (2, 0, 8), True)
    fit(tmp_path / "b", Loader(dataset(64), 16, seed=1), stop=6)
    with pytest.raises(CheckpointError, match="global batch size: saved 16, now 32"):
        fit(tmp_path / "b", Loader(dataset(64), 32, seed=1))


@pytest.mark.filterwarnings("ignore:resuming DataLoader")
def test_a_checkpoint_without_the_record_resumes_unchecked(tmp_path, monkeypatch):
    from functrain.loop import data_position

    # what a checkpoint written before the record existed holds: the data's own state only
    monkeypatch.setattr(data_position.PositionedSource, "state_dict", DataSource.state_dict)
    fit(tmp_path, dataloader(640, 16), stop=35)
    monkeypatch.undo()
    result, _ = fit(tmp_path, dataloader(320, 16))
    assert result.state.timestamp.batch > 35


def test_on_data_change_is_checked():
    with pytest.raises(ValueError, match="on_data_change='sometimes'"):
        functrain.loop.options.FitOptions.create(duration="1ep", on_data_change="sometimes")


def test_a_loader_resumes_on_other_ranks_but_a_per_rank_loader_does_not():
    from functrain.loop.data_position import PositionedSource

    # a Loader's batches are global: the same position on 2 ranks as on 1 (elastic resume)
    saved = PositionedSource(Loader(dataset(64), 16, seed=1), (0, 1)).state_dict(0)
    assert saved["definition"]["world_size"] == 1
    PositionedSource(Loader(dataset(64), 16, seed=1), (0, 2)).load_state_dict(saved, 3)
    # a DataLoader's batch size is per rank: on 2 ranks each step takes twice the samples...
    saved = PositionedSource(dataloader(64, 16), (0, 1)).state_dict(0)
    with pytest.raises(CheckpointError, match=r"saved 16 \(16 per rank x 1 ranks\), now 32 "):
        PositionedSource(dataloader(64, 16), (0, 2)).load_state_dict(saved, 3)
    # ... unless its per-rank batch size is halved: the same global batch (an elastic resume)
    saved = PositionedSource(dataloader(64, 16), (0, 1)).state_dict(0)
    sharded = torch.utils.data.DistributedSampler(dataset(64), num_replicas=2, rank=0)
    half = torch.utils.data.DataLoader(dataset(64), batch_size=8, sampler=sharded)
    PositionedSource(half, (0, 2)).load_state_dict(saved, 3)


@pytest.mark.parametrize("record", [[1], "x", {"batch_size": "12"}, {"num_samples": -1}])
def test_a_damaged_record_is_a_checkpoint_error_naming_the_data_position(tmp_path, record):
    from functrain.loop.data_position import PositionedSource

    source = PositionedSource(Loader(dataset(64), 16, seed=1), (0, 1))
    saved = {**source.state_dict(0), "definition": record}
    with pytest.raises(ValueError, match="data definition"):
        source.load_state_dict(saved, 3)
