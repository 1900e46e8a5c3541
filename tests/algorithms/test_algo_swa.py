"""swa: equal-weight average from swa_start, swapped in at swa_end; optional SWA lr curve."""

import pytest
import torch
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
from functrain.algorithms import SWAState, swa, swa_params
from functrain.functional.swa import swa_lr
from functrain.tree import tree_allclose

OPT = optim.sgd(0.05, momentum=0.9)


def test_average_is_the_mean_of_sampled_weights_and_replaces_them_at_the_end():
    model, batches = mlp(), regression_batches(10)
    state = with_horizon(functrain.init(model, OPT), 10)
    step = make(model, mse_loss, lambda: [swa("0.4dur", "0.8dur", update_interval="2ba")], OPT)
    plain = make(model, mse_loss, lambda: [], OPT)
    samples = []
    for batch in batches:
        before = state
        state, _ = step(state, batch)
        if state.timestamp.batch in (4, 6, 8):  # started at 4/10; every 2nd event; ends at 8/10
            samples.append(plain(before, batch)[0].params)
        current = state.algo_state["swa"]
        assert current.num_averaged == len(samples)
        assert current.completed == int(state.timestamp.batch >= 8)
        if state.timestamp.batch == 8:
            mean = {k: torch.stack([s[k] for s in samples]).mean(0) for k in samples[0]}
            assert tree_allclose(state.params, mean, rtol=1e-5, atol=1e-6)
            assert tree_allclose(swa_params(state), mean, rtol=1e-5, atol=1e-6)
    assert isinstance(state.algo_state["swa"], SWAState)


def test_swap_at_end_sets_params_to_the_average():
    model, batches = mlp(), regression_batches(4)
    state = with_horizon(functrain.init(model, OPT), 4)
    step = make(model, mse_loss, lambda: [swa("0.5dur", "0.75dur", update_interval="1ba")], OPT)
    snapshots = []
    for batch in batches:
        before = state
        state, _ = step(state, batch)
        if state.timestamp.batch in (2, 3):
            # reconstruct what the plain step produced: the last update's params
            plain, _ = make(model, mse_loss, lambda: [], OPT)(before, batch)
            snapshots.append(plain.params)
        if state.timestamp.batch == 3:
            mean = {k: (snapshots[0][k] + snapshots[1][k]) / 2 for k in snapshots[0]}
            assert tree_allclose(state.params, mean, rtol=1e-6, atol=1e-7)
    # after completion training goes on from the average, untouched by SWA
    assert state.algo_state["swa"].completed == 1


def test_schedule_swa_lr_rescales_steps():
    model, batches = mlp(), regression_batches(6)
    opt = optim.sgd(0.1)
    state = with_horizon(functrain.init(model, opt), 6)

    def algorithm():
        return [
            swa(
                "0.0dur",
                "1.0dur",
                update_interval="1ba",
                schedule_swa_lr=True,
                swa_lr=0.02,
                anneal_steps=2,
            )
        ]

    step = make(model, mse_loss, algorithm, opt)
    state, _ = step(state, batches[0])  # first event: start, lr 0.1 recorded
    assert state.algo_state["swa"].start_lr == pytest.approx(0.1)
    for batch in batches[1:3]:
        n = state.algo_state["swa"].num_averaged
        wanted = swa_lr(0.1, 0.02, n, 2, "linear")
        plain, _ = make(model, mse_loss, lambda: [], opt)(state, batch)
        new, _ = step(state, batch)
        for k in state.params:
            torch.testing.assert_close(
                new.params[k] - state.params[k],
                (plain.params[k] - state.params[k]) * (wanted / 0.1),
                rtol=1e-4,
                atol=1e-7,
            )
        state = new


def test_epoch_units():
    model, batches = mlp(), regression_batches(8)
    state = with_horizon(functrain.init(model, OPT), 8, 2)
    step = make(model, mse_loss, lambda: [swa("1ep", "3ep", update_interval="1ep")], OPT)
    counts = []
    for batch in batches:
        state, _ = run(step, state, [batch], batches_per_epoch=2)
        counts.append(state.algo_state["swa"].num_averaged)
    assert counts == [0, 1, 1, 2, 2, 3, 3, 3]
    assert state.algo_state["swa"].completed == 1


def test_pure_and_resumable():
    model, batches = mlp(), regression_batches(6)
    opt = optim.sgd(0.1, momentum=0.9)
    state = with_horizon(functrain.init(model, opt), 6)

    def factory():
        return [
            swa(
                "0.3dur",
                "0.9dur",
                update_interval="1ba",
                schedule_swa_lr=True,
                anneal_strategy="cos",
                anneal_steps=3,
                swa_lr=0.01,
            )
        ]

    assert_pure(make(model, mse_loss, factory, opt), state, batches[0])
    assert_resume_exact(model, mse_loss, factory, state, batches, opt=opt)


def test_argument_errors():
    with pytest.raises(ValueError, match="same unit"):
        swa("1ep", "0.9dur")
    with pytest.raises(ValueError, match="after"):
        swa("0.9dur", "0.5dur")
    with pytest.raises(ValueError, match="update_interval"):
        swa(update_interval="0.1dur")
    with pytest.raises(ValueError, match="anneal_strategy"):
        swa(anneal_strategy="exp")
    with pytest.raises(ValueError, match="anneal_steps"):
        swa(anneal_steps=0)
