"""gyro_dropout: surgery + masks picked from the run's key on Composer's schedule."""

import pytest
import torch
from _algo_model_helpers import (
    assert_pure,
    assert_resume_exact,
    make,
    regression_batches,
    with_horizon,
)
from torch import nn

import functrain
from functrain import optim
from functrain.algorithms import apply_surgery, gyro_dropout
from functrain.algorithms.gyro_dropout import mask_period

OPT = optim.sgd(0.05)


def dropout_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def test_masks_change_only_every_period_and_follow_the_seed():
    algorithm = gyro_dropout(p=0.5, sigma=4, tau=2)
    model = apply_surgery(dropout_mlp(), [algorithm])
    assert type(model[2]).__name__ == "GyroDropout"
    state = with_horizon(functrain.init(model, OPT), 16)
    assert mask_period(16, 4, 2) == 8
    step = make(model, loss, lambda: [algorithm], OPT)
    indices, seeds = [], set()
    for batch in regression_batches(10):
        state, _ = step(state, batch)
        indices.append(tuple(state.buffers["2.mask_index"].tolist()))
        seeds.add(int(state.buffers["2.mask_seed"]))
    assert len(seeds) == 1 and len(set(indices[:8])) == 1 and indices[8] == indices[9]
    other = with_horizon(functrain.init(model, OPT, seed=1), 16)
    other, _ = step(other, regression_batches(1)[0])
    assert int(other.buffers["2.mask_seed"]) not in seeds


def test_pure_and_resumable():
    def factory():
        return [gyro_dropout(p=0.3, sigma=4, tau=2)]

    model = apply_surgery(dropout_mlp(), factory())
    state = with_horizon(functrain.init(model, OPT), 4)
    batches = regression_batches(4)
    assert_pure(make(model, loss, factory, OPT), state, batches[0])
    assert_resume_exact(model, loss, factory, state, batches, opt=OPT)


def test_errors():
    with pytest.raises(ValueError, match="tau"):
        gyro_dropout(sigma=4, tau=8)
    model = apply_surgery(dropout_mlp(), [gyro_dropout(sigma=4, tau=2)])
    step = make(model, loss, lambda: [gyro_dropout(sigma=4, tau=2)], OPT)
    with pytest.raises(ValueError, match="max_batches"):
        step(functrain.init(model, OPT), regression_batches(1)[0])


def test_composers_iters_per_epoch_and_max_epoch_pace_the_masks():
    # 4 iterations x 4 epochs = 16 batches, sigma 4, tau 2: Composer's period int(16 / 4) * 2 = 8,
    # with no horizon in the state at all.
    algorithm = gyro_dropout(p=0.5, sigma=4, tau=2, iters_per_epoch=4, max_epoch=4)
    model = apply_surgery(dropout_mlp(), [algorithm])
    step = make(model, loss, lambda: [algorithm], OPT)
    state = functrain.init(model, OPT)
    assert state.timestamp.max_batches == 0
    indices = []
    for batch in regression_batches(10):
        state, _ = step(state, batch)
        indices.append(tuple(state.buffers["2.mask_index"].tolist()))
    assert len(set(indices[:8])) == 1 and indices[8] == indices[9]
    with pytest.raises(ValueError, match="together"):
        gyro_dropout(iters_per_epoch=4)
