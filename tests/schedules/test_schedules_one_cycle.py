"""The one-cycle pair equals torch's `OneCycleLR` (lr and momentum) at every step of the cycle."""

import doctest
import importlib
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain import optim
from functrain import schedules as S
from functrain.units import Timestamp


def torch_one_cycle(total, *, beta=False, max_lr=0.1, **kwargs):
    """Every step's lr and momentum, flat, of torch's OneCycleLR on a throwaway optimizer."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = (
        torch.optim.Adam([p], lr=max_lr) if beta else torch.optim.SGD([p], lr=max_lr, momentum=0.9)
    )
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=max_lr, total_steps=total, **kwargs)
    values = []
    for _ in range(total):
        group = opt.param_groups[0]
        values += [group["lr"], group["betas"][0] if beta else group["momentum"]]
        opt.step()
        sched.step()
    return values


def ours(total, *, max_lr=0.1, **kwargs):
    momentum_args = {k: kwargs.pop(k) for k in ("base_momentum", "max_momentum") if k in kwargs}
    shape = {k: kwargs[k] for k in ("pct_start", "anneal_strategy", "three_phase") if k in kwargs}
    lr = max_lr * S.one_cycle(f"{total}ba", **kwargs)
    momentum = S.one_cycle_momentum(f"{total}ba", **shape, **momentum_args)
    return [v for t in range(total) for v in (lr(t), momentum(t))]


CONFIGS = [
    {},
    {"anneal_strategy": "linear"},
    {"three_phase": True},
    {"three_phase": True, "anneal_strategy": "linear", "pct_start": 0.25},
    {"pct_start": 0.5, "div_factor": 10.0, "final_div_factor": 100.0},
    {"base_momentum": 0.8, "max_momentum": 0.99, "pct_start": 0.1},
]


@pytest.mark.parametrize("total", [7, 100, 1000])
@pytest.mark.parametrize("config", CONFIGS)
def test_equals_torch_one_cycle_lr_at_every_step(config, total):
    expected = torch_one_cycle(total, **config)
    got = ours(total, **dict(config))
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_the_momentum_is_adams_beta1_as_well():
    expected = torch_one_cycle(50, beta=True, three_phase=True)
    assert ours(50, three_phase=True) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(2, 300),
    pct_start=st.floats(0.0, 1.0),
    strategy=st.sampled_from(["cos", "linear"]),
    three_phase=st.booleans(),
    div_factor=st.floats(1.0, 1e3),
    final_div_factor=st.floats(1.0, 1e5),
    max_lr=st.floats(1e-5, 10.0),
    momenta=st.tuples(st.floats(0.0, 0.99), st.floats(0.0, 0.99)),
)
def test_equals_torch_for_any_configuration(
    total, pct_start, strategy, three_phase, div_factor, final_div_factor, max_lr, momenta
):
    config = dict(
        pct_start=pct_start,
        anneal_strategy=strategy,
        three_phase=three_phase,
        div_factor=div_factor,
        final_div_factor=final_div_factor,
        base_momentum=min(momenta),
        max_momentum=max(momenta),
    )
    try:
        expected = torch_one_cycle(total, max_lr=max_lr, **config)
    except ZeroDivisionError:  # torch divides by a zero-length phase; we take its end value
        return
    got = ours(total, max_lr=max_lr, **dict(config))
    # Annealing to a tiny lr cancels (`(end - start) * pct + start`): torch's value and ours
    # both carry an absolute error of a few ulps of max_lr, which is what we allow.
    assert got == pytest.approx(expected, rel=1e-9, abs=max(max_lr, 1.0) * 1e-13)


def test_after_the_cycle_the_values_hold_and_bounds_hold():
    lr, mom = S.one_cycle("100ba"), S.one_cycle_momentum("100ba")
    assert lr(99) == lr(100) == lr(500) == pytest.approx(1 / 25 / 1e4)
    assert mom(99) == mom(100) == mom(500) == 0.95
    values = [lr(t) for t in range(100)]
    assert max(values) == 1.0 and min(values) == pytest.approx(1 / 25 / 1e4)
    assert all(0.85 <= mom(t) <= 0.95 for t in range(100))


def test_lr_and_momentum_move_inversely():
    lr, mom = S.one_cycle("60ba", pct_start=0.4), S.one_cycle_momentum("60ba", pct_start=0.4)
    for t in range(59):
        d_lr, d_mom = lr(t + 1) - lr(t), mom(t + 1) - mom(t)
        assert d_lr * d_mom <= 0


def test_duration_units_resolve_through_the_horizon():
    s = S.one_cycle("1dur")
    assert s(Timestamp(batch=29, max_batches=100)) == S.one_cycle("100ba")(29) == 1.0
    assert S.one_cycle("2ep")(Timestamp(batch=5, batches_per_epoch=10)) == 1.0  # 20 * 0.3 - 1


def test_config_round_trip_and_scaling():
    for s in (0.1 * S.one_cycle("100ba", three_phase=True), S.one_cycle_momentum("2ep")):
        assert S.from_config(json.loads(json.dumps(s.to_config()))) == s
    scaled = S.scale_schedule_ratio(S.one_cycle("100ba"), 0.5)
    assert scaled(14) == S.one_cycle("50ba")(14)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="pct_start"):
        S.one_cycle(pct_start=1.5)
    with pytest.raises(ValueError, match="anneal_strategy"):
        S.one_cycle(anneal_strategy="cosine")
    with pytest.raises(ValueError, match="div_factor"):
        S.one_cycle(div_factor=0.0)
    with pytest.raises(ValueError, match="max_momentum"):
        S.one_cycle_momentum(max_momentum=1.0)
    with pytest.raises(TypeError, match="three_phase"):
        S.one_cycle(three_phase=1)
    with pytest.raises(ValueError, match="wall-clock"):
        S.one_cycle("10sec")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_wired_into_an_optimizer_it_trains_as_torch_does(kind):
    """inject_hyperparams carries the pair into the update: the same parameters as torch's
    SGD/Adam driven by OneCycleLR (momentum / beta1 cycled) over a whole cycle."""
    total = 40
    torch.manual_seed(0)
    x, y, w0 = torch.randn(32, 4), torch.randn(32), torch.randn(4)

    def loss_grad(w):
        w = w.detach().requires_grad_(True)
        ((x @ w - y) ** 2).mean().backward()
        return w.grad

    p = torch.nn.Parameter(w0.clone())
    if kind == "sgd":
        topt = torch.optim.SGD([p], lr=0.05, momentum=0.9)
    else:
        topt = torch.optim.Adam([p], lr=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.05, total_steps=total)

    lr = 0.05 * S.one_cycle(f"{total}ba")
    momentum = S.one_cycle_momentum(f"{total}ba")
    if kind == "sgd":
        opt = optim.inject_hyperparams(optim.sgd)(lr=lr, momentum=momentum)
    else:
        opt = optim.chain(
            optim.inject_hyperparams(optim.scale_by_adam)(b1=momentum, b2=0.999),
            optim.inject_hyperparams(optim.scale_by_learning_rate)(lr=lr),
        )
    params = {"w": w0.clone()}
    state = opt.init(params)
    for t in range(total):
        p.grad = loss_grad(p)
        topt.step()
        sched.step()
        updates, state = opt.update(
            {"w": loss_grad(params["w"])}, state, params, time=Timestamp(batch=t)
        )
        params = optim.apply_updates(params, updates)
    torch.testing.assert_close(params["w"], p.detach(), rtol=1e-5, atol=1e-6)


def test_docstring_examples():
    # `functrain.schedules.one_cycle` is the class; the module is reached by its full name.
    module = importlib.import_module("functrain.schedules.one_cycle")
    assert doctest.testmod(module).failed == 0
