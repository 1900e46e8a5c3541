"""masked: masked-out leaves are untouched and stateless; passthrough; no_decay_mask."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import (
    MaskedState,
    adamw,
    apply_updates,
    chain,
    masked,
    no_decay_mask,
    scale,
    sgd,
)

NAMES = ("fc.weight", "fc.bias", "conv.weight")


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    keep=st.lists(st.booleans(), min_size=3, max_size=3),
    donate=st.booleans(),
    as_callable=st.booleans(),
)
def test_masked_leaves_untouched(random_tree, seed, keep, donate, as_callable):
    mask = dict(zip(NAMES, keep))
    opt = masked(adamw(1e-2), (lambda params: mask) if as_callable else mask)
    params = random_tree(seed)
    originals = {k: v.clone() for k, v in params.items()}
    state = opt.init(params)
    assert isinstance(state, MaskedState)
    # The inner state only covers the selected parameters.
    assert set(state.inner_state[0].mu) == {k for k in NAMES if mask[k]}
    for step in range(3):
        grads = random_tree(seed + step + 1)
        updates, state = opt.update(grads, state, params, donate=donate)
        params = apply_updates(params, updates, donate=donate)
    for k in NAMES:
        if mask[k]:
            assert not torch.equal(params[k], originals[k])
        else:
            assert torch.equal(params[k], originals[k])


def test_masked_passthrough_keeps_incoming_updates():
    grads = {"w": torch.ones(2, 2), "b": torch.ones(2)}
    t = masked(scale(3.0), no_decay_mask, passthrough=True)
    updates, _ = t.update(grads, t.init(grads), grads)
    assert torch.equal(updates["w"], 3 * torch.ones(2, 2))
    assert updates["b"] is grads["b"]


def test_masked_zero_update_by_default():
    grads = {"w": torch.ones(2, 2), "b": torch.ones(2)}
    t = masked(scale(3.0), no_decay_mask)
    updates, _ = t.update(grads, t.init(grads), grads)
    assert torch.equal(updates["b"], torch.zeros(2))
    assert list(updates) == list(grads)  # same structure, same order


def test_weight_decay_mask_only_skips_the_decay():
    # With zero gradients only weight decay moves a parameter.
    params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    opt = sgd(0.1, weight_decay=0.5, weight_decay_mask=no_decay_mask)
    updates, _ = opt.update(zeros, opt.init(params), params)
    assert torch.allclose(updates["w"], torch.full((2, 2), -0.05))
    assert torch.equal(updates["b"], torch.zeros(2))
    # ... while the gradient step still applies to masked-out leaves.
    ones = {k: torch.ones_like(v) for k, v in params.items()}
    updates, _ = opt.update(ones, opt.init(params), params)
    assert torch.allclose(updates["b"], torch.full((2,), -0.1))


def test_no_decay_mask():
    params = {
        "fc.weight": torch.zeros(2, 3),
        "fc.bias": torch.zeros(2),
        "norm.weight": torch.zeros(3),
        "conv.weight": torch.zeros(1, 1, 3, 3),
    }
    assert no_decay_mask(params) == {
        "fc.weight": True,
        "fc.bias": False,
        "norm.weight": False,
        "conv.weight": True,
    }


def test_masked_in_chain_and_errors():
    params = {"w": torch.ones(2), "b": torch.ones(2)}
    opt = chain(masked(sgd(1.0), {"w": True, "b": False}), scale(2.0))
    updates, _ = opt.update(params, opt.init(params), params)
    assert torch.equal(updates["w"], -2 * torch.ones(2)) and torch.equal(
        updates["b"], torch.zeros(2)
    )
    with pytest.raises(ValueError, match="no entry for"):
        masked(sgd(1.0), {"w": True}).init(params)
    with pytest.raises(TypeError, match="dict"):
        masked(sgd(1.0), {"w": True}).init([torch.ones(2)])
    # Extra mask names (e.g. frozen parameters outside the optimizer) are ignored.
    extra = masked(sgd(1.0), {"w": True, "b": True, "frozen": False})
    extra.update(params, extra.init(params), params)


def test_callable_mask_is_built_from_the_params_not_the_grads():
    # The mask selects by value, and params and grads disagree: built from the params, "w" is
    # selected (it moves by -lr * g = -0.1 * -1) and "b" is not (a zero update).
    by_sign = masked(sgd(0.1), lambda tree: {k: bool(v.sum() > 0) for k, v in tree.items()})
    params = {"w": torch.ones(2), "b": -torch.ones(2)}
    grads = {"w": -torch.ones(2), "b": torch.ones(2)}
    updates, _ = by_sign.update(grads, by_sign.init(params), params)
    assert torch.equal(updates["w"], torch.full((2,), 0.1))
    assert torch.equal(updates["b"], torch.zeros(2))
    # without params, the documented fallback: built from the grads ("b" selected)
    updates, _ = by_sign.update(grads, by_sign.init(params))
    assert torch.equal(updates["w"], torch.zeros(2))
    assert torch.equal(updates["b"], torch.full((2,), -0.1))


def test_missing_mask_entries_error_names_the_first_five():
    params = {f"p{i}": torch.ones(1) for i in range(8)}
    with pytest.raises(ValueError) as err:
        masked(sgd(1.0), {"p0": True}).init(params)
    assert "['p1', 'p2', 'p3', 'p4', 'p5']" in str(err.value)
