"""ema: a moving average of the weights in algo_state, visible through swap_in_ema.

The laws (purity over several steps, determinism, training untouched by any smoothing, resume
through `fit` and a checkpoint Manager) are checked with `functrain.testing`.
"""

import pytest
import torch
from _algo_model_helpers import (
    assert_pure,
    assert_resume_exact,
    make,
    regression_batches,
    run,
    with_horizon,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import functrain
from functrain import optim
from functrain.algorithms import EMAState, ema, ema_params, label_smoothing, swap_in_ema
from functrain.functional.ema import compute_ema
from functrain.testing import (
    check_commutes,
    check_determinism,
    check_identity_at_zero,
    check_purity,
    check_resume_equivalence,
)
from functrain.tree import tree_allclose


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


OPT = optim.sgd(0.05, momentum=0.9)


def test_smoothing_zero_tracks_the_model_exactly():
    model, batches = bn_model(), regression_batches(3)
    state = functrain.init(model, OPT)
    step = make(model, loss, lambda: [ema(smoothing=0.0)], OPT)
    for batch in batches:
        state, _ = step(state, batch)
        assert tree_allclose(ema_params(state), state.params)
        assert tree_allclose(swap_in_ema(state).buffers, state.buffers)


@settings(max_examples=10, deadline=None)
@given(smoothing=st.floats(0.0, 1.0), n=st.integers(2, 4))
def test_average_follows_the_recurrence(smoothing, n):
    model, batches = bn_model(), regression_batches(n)
    state = functrain.init(model, OPT)
    step = make(model, loss, lambda: [ema(smoothing=smoothing)], OPT)
    expected = None
    for batch in batches:
        state, _ = step(state, batch)
        expected = (
            dict(state.params)
            if expected is None
            else compute_ema(state.params, expected, smoothing)
        )
    assert tree_allclose(ema_params(state), expected)
    assert state.algo_state["ema"].num_updates == n


def test_half_life_and_interval():
    # half-life 2 updates every 2 batches: smoothing 2 ** (-2 / 4) with half_life "4ba"
    model, batches = bn_model(), regression_batches(6)
    state = functrain.init(model, OPT)
    step = make(model, loss, lambda: [ema(half_life="4ba", update_interval="2ba")], OPT)
    expected, snapshots = None, []
    for i, batch in enumerate(batches):
        state, _ = step(state, batch)
        if (i + 1) % 2 == 0:
            expected = (
                dict(state.params)
                if expected is None
                else compute_ema(state.params, expected, 2**-0.5)
            )
        snapshots.append(state.algo_state["ema"].num_updates)
    assert snapshots == [0, 1, 1, 2, 2, 3]
    assert tree_allclose(ema_params(state), expected, rtol=1e-6, atol=1e-7)


def test_ema_start_waits_and_swap_is_identity_before():
    model, batches = bn_model(), regression_batches(4)
    state = with_horizon(functrain.init(model, OPT), 4)
    step = make(model, loss, lambda: [ema(half_life="1ba", ema_start="0.5dur")], OPT)
    counts = []
    for batch in batches:
        state, _ = step(state, batch)
        counts.append(state.algo_state["ema"].num_updates)
        if counts[-1] == 0:
            assert swap_in_ema(state) is state
    assert counts == [0, 1, 2, 3]


def test_epoch_interval_updates_at_epoch_ends():
    model, batches = bn_model(), regression_batches(6)
    state = with_horizon(functrain.init(model, OPT), 6, 3)
    step = make(model, loss, lambda: [ema(half_life="1ep")], OPT)
    counts = []
    for batch in batches:
        state, _ = run(step, state, [batch], batches_per_epoch=3)
        counts.append(state.algo_state["ema"].num_updates)
    assert counts == [0, 0, 1, 1, 1, 2]


def test_eval_sees_the_ema_weights():
    model, batches = bn_model(), regression_batches(5)
    state = functrain.init(model, OPT)
    step = make(model, loss, lambda: [ema(smoothing=0.5)], OPT)
    state, _ = run(step, state, batches)
    x = batches[0][0]
    swapped = swap_in_ema(state)
    model.eval()
    out = step.call_model(swapped, x)
    reference = torch.func.functional_call(
        model, {**ema_params(state), **state.algo_state["ema"].buffers}, (x,)
    )
    model.train()
    torch.testing.assert_close(out, reference)
    assert not tree_allclose(swapped.params, state.params)
    assert isinstance(state.algo_state["ema"], EMAState)


def test_pure_and_resumable():
    model, batches = bn_model(), regression_batches(6)
    state = functrain.init(model, OPT)

    def factory():
        return [ema(half_life="2ba")]

    assert_pure(make(model, loss, factory, OPT), state, batches[0])
    assert_resume_exact(model, loss, factory, state, batches, opt=OPT)


def test_argument_errors():
    with pytest.raises(ValueError, match="not both"):
        ema(half_life="10ba", smoothing=0.9)
    with pytest.raises(ValueError, match="either"):
        ema(half_life=None)
    with pytest.raises(ValueError, match="same unit"):
        ema(half_life="10ba", update_interval="1ep")
    with pytest.raises(ValueError, match="units"):
        ema(half_life="0.1dur")
    with pytest.raises(KeyError, match="compose"):
        ema_params(functrain.init(bn_model(), OPT))


def test_laws():
    check_purity(ema(half_life="2ba"), steps=3)  # step 3 averages an existing average
    check_determinism(ema(smoothing=0.5), steps=3)
    # EMA never changes training: at any smoothing the trained state is the plain step's
    # (only algo_state["ema"] is added). The law's "strength" here is the smoothing.
    for smoothing in (0.0, 0.5, 1.0):
        check_identity_at_zero(ema, strength="smoothing", zero=smoothing, steps=3)
    # after_update and prepare: composed in either order, the same run
    check_commutes(ema(smoothing=0.5), label_smoothing(0.1), steps=3)


@pytest.mark.parametrize("interval", ["1ba", "2ba"])
def test_resumes_exactly_through_fit(interval):
    check_resume_equivalence(lambda: ema(half_life="2ba", update_interval=interval), steps=6)
