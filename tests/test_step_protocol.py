"""The StepLike protocol (what fit, evaluate and predict ask of a step), implemented by Step,
CompiledStep and as_step(fn); and what a step decides once per state (the lr it reports, the
in-place fast path) staying right when the state changes under it."""

import copy

import pytest
import torch
import torch.nn.functional as F

import functrain
from functrain import optim
from functrain.algorithms import ema
from functrain.optim import current_lr
from functrain.step.protocol import FunctionStep
from functrain.tree import tree_allclose, tree_clone


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def batches(n=4):
    gen = torch.Generator().manual_seed(2)
    return [(torch.randn(6, 4, generator=gen), torch.randint(0, 3, (6,), generator=gen))] * n


def test_step_compiled_step_and_plain_functions_implement_the_protocol():
    model = mlp()
    opt = optim.adamw(lr=1e-3)
    step = functrain.compose(functrain.make_step(model, ce, opt, precision="amp_fp16"), ema())
    compiled = functrain.compile_step(step)
    plain = functrain.as_step(lambda state, batch: (state, {}))
    for s in (step, compiled, plain):
        assert isinstance(s, functrain.StepLike)
        assert functrain.as_step(s) is s
    assert isinstance(plain, FunctionStep)
    with pytest.raises(TypeError, match="callable as step"):
        functrain.as_step(model)

    # donated(): a donating version; a donating step is its own donated version
    donating = step.donated()
    assert donating.config.donate and not step.config.donate
    assert donating.donated() is donating and plain.donated() is plain
    assert compiled.donated().step.config.donate
    assert donating.algorithms == step.algorithms

    # init_state(): adds the fp16 loss scale and EMA's state, once (idempotent)
    state = functrain.init(model, opt)
    assert set(state.algo_state) == set()
    full = step.init_state(state)
    assert set(full.algo_state) == {"loss_scale", "ema"}
    assert step.init_state(full) is full and compiled.init_state(full) is full
    assert compiled.init_state(state).algo_state.keys() == full.algo_state.keys()
    assert plain.init_state(state) is state

    # evaluator(): the model, how to call it with a state's tensors, the loss
    evaluator = step.evaluator()
    assert evaluator.module is model and evaluator.loss_fn is ce
    other = tree_clone(state).replace(params={k: v * 2 for k, v in state.params.items()})
    x = torch.randn(3, 4)
    with torch.no_grad():
        twice = copy.deepcopy(model)
        for p in twice.parameters():
            p.mul_(2)
        assert torch.allclose(evaluator.call_model(other, x), twice(x))
    assert compiled.evaluator().module is model
    assert plain.evaluator() is None


def schedule(t):
    return 1e-3 * (1 + (t.batch if hasattr(t, "batch") else t))


SCHEDULED = [schedule(i) for i in range(4)]


@pytest.mark.parametrize(
    "make_opt, expected",
    [
        (lambda: optim.sgd(lr=0.1, momentum=0.9), [0.1] * 4),
        (lambda: optim.adamw(lr=2e-3), [2e-3] * 4),
        (lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(lr=schedule)), SCHEDULED),
        (lambda: optim.inject_hyperparams(optim.adamw)(lr=schedule, weight_decay=0.1), SCHEDULED),
    ],
    ids=["sgd", "adamw", "chain_clip_scheduled_adamw", "inject_hyperparams"],
)
@pytest.mark.parametrize("donate", [False, True])
def test_the_reported_lr_is_the_one_used_at_every_step(make_opt, expected, donate):
    model = mlp()
    opt = make_opt()
    state = functrain.init(model, opt)
    step = functrain.make_step(model, ce, opt, donate=donate)
    lrs = []
    for batch in batches():
        state, metrics = step(state, batch)
        assert metrics["lr"] == current_lr(state.opt_state)
        lrs.append(metrics["lr"])
    assert lrs == pytest.approx(expected)


def test_a_donating_step_runs_in_place_only_on_the_models_own_tensors():
    model = mlp()
    opt = optim.adamw(lr=1e-2)
    donating = functrain.make_step(model, ce, opt, donate=True)
    own = functrain.init(model, opt)
    foreign = tree_clone(functrain.init(mlp(), opt))
    foreign = foreign.replace(params={k: v + 0.5 for k, v in foreign.params.items()})
    expected = foreign
    pure = functrain.make_step(mlp(), ce, opt)
    for batch in batches(2):
        expected, _ = pure(expected, batch)
    for batch in batches(2):
        own, _ = donating(own, batch)  # the fast path: the model's own tensors
    assert donating._grads_piece.in_place(own)
    got = tree_clone(foreign)
    assert not donating._grads_piece.in_place(got)
    for batch in batches(2):
        got, _ = donating(got, batch)  # another state: its tensors swapped in, not the model's
    assert tree_allclose(got.params, expected.params, atol=1e-6)
    assert tree_allclose(got.opt_state, expected.opt_state, atol=1e-6)
