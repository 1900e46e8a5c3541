"""TrainState: a frozen pytree built from a module without copying."""

import dataclasses

import pytest
import torch

import functrain
from functrain import optim
from functrain.tree import leaves_with_paths


def test_init_shares_storage_and_checkpoints_by_path():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = functrain.init(model, optim.adamw(lr=1e-3), seed=5)
    assert state.params["0.weight"].data_ptr() == model[0].weight.data_ptr()
    assert not state.params["0.weight"].requires_grad
    assert state.rng.seed == 5 and state.step == 0
    paths = [p for p, _ in leaves_with_paths(state)]
    assert "params.0.weight" in paths and "buffers.1.running_mean" in paths
    assert "timestamp.batch" in paths and "rng.seed" in paths
    assert all(isinstance(x, (torch.Tensor, int, float)) for _, x in leaves_with_paths(state))


def test_state_is_frozen_and_replace_returns_a_copy():
    state = functrain.init(torch.nn.Linear(2, 2), optim.sgd(lr=0.1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.step = 3
    assert state.replace(step=3).step == 3 and state.step == 0


def test_init_rejects_non_optimizers():
    with pytest.raises(TypeError, match="Transform"):
        functrain.init(torch.nn.Linear(2, 2), torch.optim.SGD)
