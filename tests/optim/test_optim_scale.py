"""scale, scale_by_learning_rate (numbers and schedules), and the two weight decays."""

import pytest
import torch

from functrain.optim import (
    DecoupledWeightDecayState,
    ScaleByLearningRateState,
    add_decayed_weights,
    add_decoupled_weight_decay,
    scale,
    scale_by_learning_rate,
)
from functrain.time import Timestamp


def test_scale():
    g = {"w": torch.tensor([1.0, -2.0])}
    t = scale(-0.5)
    updates, _ = t.update(g, t.init(g))
    assert torch.equal(updates["w"], torch.tensor([-0.5, 1.0]))


def test_scale_by_learning_rate_records_the_value_used():
    g = {"w": torch.ones(2)}
    t = scale_by_learning_rate(lambda t: 0.1 * (t.batch if isinstance(t, Timestamp) else t + 1))
    state = t.init(g)
    assert state == ScaleByLearningRateState(count=0, lr=0.1)
    updates, state = t.update(g, state)  # no time: own count 0
    assert state == ScaleByLearningRateState(count=1, lr=0.1)
    updates, state = t.update(g, state, time=Timestamp(batch=7))
    assert state.lr == pytest.approx(0.7) and state.count == 2
    assert torch.allclose(updates["w"], torch.full((2,), -0.7))
    up, _ = scale_by_learning_rate(0.1, flip_sign=False).update(g, state)
    assert torch.allclose(up["w"], torch.full((2,), 0.1))


def test_add_decayed_weights_needs_params():
    t = add_decayed_weights(0.1)
    g, p = {"w": torch.zeros(2)}, {"w": torch.full((2,), 3.0)}
    updates, _ = t.update(g, t.init(p), p)
    assert torch.allclose(updates["w"], torch.full((2,), 0.3))
    with pytest.raises(ValueError, match="needs the current parameters"):
        t.update(g, t.init(p))
    # A superset of parameters (e.g. frozen ones as well) is fine.
    updates, _ = t.update(g, t.init(p), {**p, "frozen": torch.ones(1)})
    assert torch.allclose(updates["w"], torch.full((2,), 0.3))
    # With no decay the params are not needed at all.
    assert add_decayed_weights(0.0).update(g, t.init(p))[0] is g


def test_add_decoupled_weight_decay_follows_the_schedule_ratio():
    p, g = {"w": torch.full((2,), 2.0)}, {"w": torch.zeros(2)}
    t = add_decoupled_weight_decay(0.1, lr=lambda t: 1e-3 * 0.5**t, initial_lr=1e-3)
    state = t.init(p)
    assert state == DecoupledWeightDecayState(count=0, factor=1.0)
    u0, state = t.update(g, state, p)
    u1, state = t.update(g, state, p)
    assert torch.allclose(u0["w"], torch.full((2,), -0.2))
    assert torch.allclose(u1["w"], torch.full((2,), -0.1))
    assert state.factor == 0.5
    zero_base = add_decoupled_weight_decay(0.1, lr=0.5, initial_lr=0.0)
    u, _ = zero_base.update(g, zero_base.init(p), p)  # Composer: initial_lr 0 -> factor 1
    assert torch.allclose(u["w"], torch.full((2,), -0.2))


def test_bad_hyperparameters():
    with pytest.raises(ValueError, match="lr"):
        scale_by_learning_rate(-1.0)
    with pytest.raises(TypeError, match="weight_decay"):
        add_decayed_weights("0.1x")
    with pytest.raises(ValueError, match="initial_lr"):
        add_decoupled_weight_decay(0.1, lr=lambda t: 1.0)
