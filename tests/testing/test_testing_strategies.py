"""The strategies: models, batches that fit them, states, keys; cases rebuild identically."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from functrain import optim
from functrain.rng import RngState, key_for
from functrain.testing import Case, batches, cases, keys, models, states
from functrain.tree import tree_allclose


@given(model=models(), data=st.data())
def test_batches_fit_their_model(model, data):
    x, y = data.draw(batches(model))
    assert x.shape[1:] == model.input_shape and 2 <= len(x) <= 6
    out = model(x)
    assert out.shape == (len(x), model.classes)
    assert y.dtype == torch.long and 0 <= int(y.min()) and int(y.max()) < model.classes


@given(case=cases())
def test_a_case_rebuilds_identically_and_leaves_the_global_generator_alone(case):
    before = torch.get_rng_state()
    a, b = case.model(), case.model()
    assert torch.equal(torch.get_rng_state(), before)
    assert tree_allclose(dict(a.state_dict()), dict(b.state_dict()))
    assert tree_allclose(case.batches(2), case.batches(2))
    assert not torch.equal(case.batch(0)[0], case.batch(1)[0])
    x, y = case.batch(0)
    assert x.shape == (case.batch_size, *case.input_shape)
    assert case.model()(x).shape == (case.batch_size, case.classes)


@given(state=states(optim.adamw(1e-3), models(kinds=("cnn",))))
def test_states_are_initial_train_states(state):
    assert state.step == 0 and state.opt_state is not None
    assert "bn.running_mean" in state.buffers
    assert 0 <= state.rng.seed < 2**31


@given(key=keys())
def test_keys_give_reproducible_draws(key):
    assert isinstance(key, RngState)
    a = torch.rand(3, generator=key_for(key, 0, "law"))
    assert torch.equal(a, torch.rand(3, generator=key_for(key, 0, "law")))


def test_case_arguments_are_checked():
    import pytest

    with pytest.raises(ValueError, match="kind"):
        Case(kind="rnn").model()
    with pytest.raises(ValueError, match="batch_size"):
        Case(batch_size=1).model()
    with pytest.raises(ValueError, match="kinds"):
        cases(kinds=("rnn",))
    with pytest.raises(TypeError, match="input_shape"):
        batches(torch.nn.Linear(2, 2))
