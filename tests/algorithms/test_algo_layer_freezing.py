"""layer_freezing: earliest layers stop changing from freeze_start on, per Composer's schedule."""

import pytest
from _algo_model_helpers import (
    assert_pure,
    assert_resume_exact,
    make,
    mlp,
    mse_loss,
    regression_batches,
    run,
    with_horizon,
)

import functrain
from functrain import optim
from functrain.algorithms import layer_freezing
from functrain.functional.layer_freezing import freeze_fraction, frozen_names
from functrain.tree import tree_allclose

OPT = optim.decoupled_adamw(1e-2, weight_decay=0.1)  # decay would move frozen weights


def test_zero_level_is_the_plain_step_exactly():
    model, batches = mlp(), regression_batches(4)
    state = with_horizon(functrain.init(model, OPT), 4, 1)
    plain, _ = run(make(model, mse_loss, lambda: [], OPT), state, batches, batches_per_epoch=1)
    frozen, _ = run(
        make(model, mse_loss, lambda: [layer_freezing(0.0, 0.0)], OPT),
        state,
        batches,
        batches_per_epoch=1,
    )
    assert tree_allclose(plain, frozen)


def test_frozen_layers_keep_their_values_and_the_last_layer_trains():
    model = mlp()
    batches = regression_batches(8)
    state = with_horizon(functrain.init(model, OPT), 8, 2)  # 4 epochs of 2 batches
    step = make(model, mse_loss, lambda: [layer_freezing(freeze_start=0.25, freeze_level=1.0)], OPT)
    names = list(state.params)
    for epoch in range(4):
        start = state
        state, _ = run(step, state, batches[2 * epoch : 2 * epoch + 2], batches_per_epoch=2)
        expected = frozen_names(names, freeze_fraction(epoch * 2 / 8, 0.25, 1.0))
        for name in names:
            same = bool((start.params[name] == state.params[name]).all())
            assert same == (name in expected), (epoch, name)
    assert "4.weight" not in frozen_names(names, 1.0)  # the output layer is never frozen


def test_pure_and_resumable():
    model, batches = mlp(), regression_batches(6)
    state = with_horizon(functrain.init(model, OPT), 6, 2)

    def factory():
        return [layer_freezing(0.2, 1.0)]

    assert_pure(make(model, mse_loss, factory, OPT), state, batches[0])
    assert frozen_names(list(state.params), freeze_fraction(4 / 6, 0.2, 1.0))  # freezing happens
    assert_resume_exact(model, mse_loss, factory, state, batches, batches_per_epoch=2, opt=OPT)


def test_needs_the_horizon_and_valid_arguments():
    model, batch = mlp(), regression_batches(1)[0]
    state = functrain.init(model, OPT)
    with pytest.raises(ValueError, match="max_batches"):
        make(model, mse_loss, lambda: [layer_freezing()], OPT)(state, batch)
    with pytest.raises(ValueError, match="freeze_start"):
        layer_freezing(freeze_start=1.0)
    with pytest.raises(ValueError, match="freeze_level"):
        layer_freezing(freeze_level=1.5)
