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
from functrain.units import Timestamp


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
    assert zero_base.init(p) == DecoupledWeightDecayState(count=0, factor=1.0)
    u, _ = zero_base.update(g, zero_base.init(p), p)  # Composer: initial_lr 0 -> factor 1
    assert torch.allclose(u["w"], torch.full((2,), -0.2))


def test_add_decoupled_weight_decay_of_one_and_of_zero():
    p, g = {"w": torch.full((2,), 2.0)}, {"w": torch.full((2,), 0.5)}
    full = add_decoupled_weight_decay(1.0, lr=0.1)  # decay 1 at the base lr: g - 1 * p
    u, _ = full.update(g, full.init(p), p)
    assert torch.equal(u["w"], torch.full((2,), -1.5))
    none = add_decoupled_weight_decay(0.0, lr=0.1)  # no decay: the params are not needed
    u, state = none.update(g, none.init(p))
    assert torch.equal(u["w"], g["w"]) and state.count == 1


def test_add_decoupled_weight_decay_of_a_bare_schedule_is_relative_to_one():
    # A bare functrain schedule's values are multipliers of 1: at t=0 cosine annealing is 1, so
    # the factor is 1 (with a base of 2 it would be 0.5).
    from functrain.optim.scale import base_lr
    from functrain.schedules import cosine_annealing

    assert base_lr(cosine_annealing()) == 1.0
    p, g = {"w": torch.full((2,), 2.0)}, {"w": torch.zeros(2)}
    t = add_decoupled_weight_decay(0.1, lr=cosine_annealing(t_max="10ba"))
    u, state = t.update(g, t.init(p), p, time=Timestamp(batch=0))
    assert state.factor == 1.0
    assert torch.allclose(u["w"], torch.full((2,), -0.2))


def test_weight_decays_record_no_autograd_graph():
    # The updates are computed under no_grad: parameters that require grad (as in a step) give
    # updates with no graph behind them (else every step would keep the last one's graph).
    p = {"w": torch.full((2,), 2.0, requires_grad=True)}
    g = {"w": torch.zeros(2)}
    for t in (add_decoupled_weight_decay(0.1, lr=0.1), add_decayed_weights(0.1)):
        u, _ = t.update(g, t.init(p), p)
        assert u["w"].grad_fn is None and not u["w"].requires_grad


def test_bad_hyperparameters():
    with pytest.raises(ValueError, match="lr"):
        scale_by_learning_rate(-1.0)
    with pytest.raises(TypeError, match="weight_decay"):
        add_decayed_weights("0.1x")
    with pytest.raises(ValueError, match="initial_lr"):
        add_decoupled_weight_decay(0.1, lr=lambda t: 1.0)
