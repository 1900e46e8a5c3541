"""sgd matches torch.optim.SGD; decoupled_sgdw follows Composer's formula; trace's first step."""

import pytest
import torch

from functrain.optim import (
    ScaleByLearningRateState,
    TraceState,
    decoupled_sgdw,
    sgd,
    trace,
)

# The spec asks for 1e-6 after 200 steps; the float64 runs agree to ~1e-15 (measured).
TOL = 1e-6

SGD_CASES = {
    "plain": dict(lr=0.05),
    "momentum": dict(lr=0.05, momentum=0.9),
    "dampening": dict(lr=0.05, momentum=0.9, dampening=0.3),
    "nesterov": dict(lr=0.05, momentum=0.9, nesterov=True),
    "weight_decay": dict(lr=0.05, weight_decay=1e-2),
    "all": dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=5e-3),
}


@pytest.mark.parametrize("case", SGD_CASES)
def test_sgd_matches_torch(case, train_torch, train_functional, max_diff):
    kw = SGD_CASES[case]
    ref = train_torch(lambda ps: torch.optim.SGD(ps, **kw))
    for donate in (False, True):
        assert max_diff(train_functional(sgd(**kw), donate=donate), ref) <= TOL


@pytest.mark.parametrize("case", ["momentum", "all"])
def test_sgd_matches_torch_float32(case, train_torch, train_functional, max_diff):
    kw = SGD_CASES[case]
    ref = train_torch(lambda ps: torch.optim.SGD(ps, **kw), dtype=torch.float32)
    assert max_diff(train_functional(sgd(**kw), dtype=torch.float32), ref) <= TOL


def test_sgd_schedule_matches_lambda_lr(train_torch, train_functional, max_diff):
    def factor(t):
        return 0.99**t

    ref = train_torch(
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, factor),
    )
    got = train_functional(sgd(lambda t: 0.1 * factor(t), momentum=0.9), donate=True)
    assert max_diff(got, ref) <= TOL


def test_sgd_state_layout():
    params = {"w": torch.ones(2)}
    opt = sgd(0.1, momentum=0.9)
    state = opt.init(params)
    assert isinstance(state[1], TraceState) and state[1].count == 0
    assert isinstance(state[2], ScaleByLearningRateState) and state[2].lr == 0.1
    assert len(sgd(0.1).init(params)) == 2  # no momentum buffer without momentum


def test_trace_first_step_is_the_gradient_even_with_dampening():
    t = trace(0.9, dampening=0.5)
    g = {"w": torch.tensor([1.0, -2.0])}
    u1, s = t.update(g, t.init(g))
    assert torch.equal(u1["w"], g["w"])
    u2, s = t.update(g, s)
    assert torch.allclose(u2["w"], 0.9 * g["w"] + 0.5 * g["w"])
    assert s.count == 2


def test_sgd_bad_arguments():
    with pytest.raises(ValueError, match="nesterov"):
        sgd(0.1, nesterov=True)
    with pytest.raises(ValueError, match="nesterov"):
        sgd(0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr"):
        sgd(-0.1)
    with pytest.raises(TypeError, match="inject_hyperparams"):
        sgd(0.1, momentum=lambda t: 0.9)


def _reference_sgdw(params, grads_seq, lr_of, initial_lr, momentum, weight_decay):
    """Composer's DecoupledSGDW, written out per tensor."""
    params = {k: v.clone() for k, v in params.items()}
    bufs = {}
    for t, grads in enumerate(grads_seq):
        lr = lr_of(t)
        for k, g in grads.items():
            if momentum:
                bufs[k] = g.clone() if k not in bufs else bufs[k] * momentum + g
                g = bufs[k]
            params[k] = params[k] * (1 - (lr / initial_lr) * weight_decay) - lr * g
    return params


@pytest.mark.parametrize("donate", [False, True], ids=["pure", "donate"])
def test_decoupled_sgdw_matches_formula(donate, random_tree, max_diff):
    params = random_tree(0, dtype=torch.float64)
    grads_seq = [random_tree(s, dtype=torch.float64) for s in range(1, 31)]

    def lr_of(t):
        return 0.1 * (1 - t / 40)

    opt = decoupled_sgdw(lr_of, momentum=0.9, weight_decay=1e-2, initial_lr=0.1)
    state, p = opt.init(params), {k: v.clone() for k, v in params.items()}
    for g in grads_seq:
        g = {k: v.clone() for k, v in g.items()}
        updates, state = opt.update(g, state, p, donate=donate)
        p = {k: p[k] + updates[k] for k in p}
    ref = _reference_sgdw(params, grads_seq, lr_of, 0.1, 0.9, 1e-2)
    assert max_diff(p, ref) <= 1e-12


def test_decoupled_sgdw_decay_not_scaled_by_lr():
    # Zero gradients: only the decay acts, shrinking by (1 - wd * lr_t / lr_0) each step.
    p = {"w": torch.tensor([2.0])}
    opt = decoupled_sgdw(0.5, weight_decay=0.1)
    updates, _ = opt.update({"w": torch.zeros(1)}, opt.init(p), p)
    assert torch.allclose(p["w"] + updates["w"], torch.tensor([2.0 * 0.9]))


def test_decoupled_sgdw_schedule_needs_initial_lr():
    with pytest.raises(ValueError, match="initial_lr"):
        decoupled_sgdw(lambda t: 0.1, weight_decay=1e-4)


@pytest.mark.parametrize("nesterov", [False, True])
def test_trace_leaves_no_autograd_history(nesterov):
    # gradients that carry a graph (e.g. from create_graph): momentum buffers built from them
    # must not keep it alive, nor may the updates carry it into the parameters
    t = trace(0.9, nesterov=nesterov)
    g = {"w": torch.tensor([1.0, -2.0], requires_grad=True) * 1.0}
    state = t.init(g)
    for _ in range(2):  # the first step copies the gradient, later ones accumulate it
        updates, state = t.update(g, state)
        assert not updates["w"].requires_grad and not state.momentum["w"].requires_grad


def test_hyperparameter_errors_name_what_is_accepted():
    """The message says what the argument takes (a schedule only where one is allowed) and the
    bounds it must lie in (a half-open range where there is an upper bound)."""
    from functrain import optim

    with pytest.raises(TypeError, match=r"lr must be a number or a schedule `t -> float`, got"):
        optim.sgd("fast")
    with pytest.raises(TypeError, match=r"momentum must be a number \(schedule it with"):
        optim.trace("x")
    with pytest.raises(ValueError, match=r"beta1=1.5: it must be \[0.0, 1.0\)$"):
        optim.scale_by_adam(b1=1.5)
    with pytest.raises(ValueError, match=r"momentum=-1.0: it must be >= 0.0$"):
        optim.sgd(0.1, momentum=-1.0)
