"""multi_steps(k): k accumulated calls equal one step on the concatenated batch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import MultiStepsState, adam, apply_updates, multi_steps, sgd


def _linear_grads(params, x, y):
    """Gradients of the mean squared error of a linear model `x @ w + b`."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    loss = ((x @ leaves["w"] + leaves["b"] - y) ** 2).mean()
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(1, 4),
    momentum=st.sampled_from([0.0, 0.9]),
    donate=st.booleans(),
)
def test_multi_steps_equals_one_step_on_the_concatenated_batch(seed, k, momentum, donate):
    gen = torch.Generator().manual_seed(seed)
    params = {
        "w": torch.randn(3, 2, generator=gen, dtype=torch.float64),
        "b": torch.randn(2, generator=gen, dtype=torch.float64),
    }
    micro = 4
    steps = 2  # two real steps, so the momentum buffer is exercised too
    xs = torch.randn(steps * k * micro, 3, generator=gen, dtype=torch.float64)
    ys = torch.randn(steps * k * micro, 2, generator=gen, dtype=torch.float64)

    big, big_state = dict(params), sgd(0.1, momentum=momentum).init(params)
    ref_opt = sgd(0.1, momentum=momentum)
    for s in range(steps):
        sl = slice(s * k * micro, (s + 1) * k * micro)
        updates, big_state = ref_opt.update(_linear_grads(big, xs[sl], ys[sl]), big_state, big)
        big = apply_updates(big, updates)

    opt = multi_steps(sgd(0.1, momentum=momentum), every_k=k)
    acc, state = dict(params), opt.init(params)
    for i in range(steps * k):
        sl = slice(i * micro, (i + 1) * micro)
        before = {n: v.clone() for n, v in acc.items()}
        updates, state = opt.update(_linear_grads(acc, xs[sl], ys[sl]), state, acc, donate=donate)
        acc = apply_updates(acc, updates, donate=donate)
        if (i + 1) % k:  # not a real step: no change, the inner state does not advance
            assert all(torch.equal(acc[n], before[n]) for n in acc)
            assert state.mini_step == (i + 1) % k
    assert state.mini_step == 0
    assert all(torch.allclose(acc[n], big[n], rtol=0, atol=1e-12) for n in acc)


def test_multi_steps_state_and_inner_count():
    params = {"w": torch.zeros(2)}
    opt = multi_steps(adam(1e-3), every_k=3)
    state = opt.init(params)
    assert isinstance(state, MultiStepsState) and state.mini_step == 0
    for _ in range(3):
        updates, state = opt.update({"w": torch.ones(2)}, state, params)
    assert state.inner_state[1].count == 1  # adam stepped once
    assert torch.equal(state.grad_acc["w"], torch.zeros(2))  # reset after the real step
    assert not torch.equal(updates["w"], torch.zeros(2))


def test_multi_steps_bad_every_k():
    with pytest.raises(ValueError, match="every_k"):
        multi_steps(sgd(0.1), every_k=0)
    with pytest.raises(ValueError, match="every_k"):
        multi_steps(sgd(0.1), every_k=2.0)
