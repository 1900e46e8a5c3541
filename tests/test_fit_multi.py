"""`fit` over a pytree of states: the loop's own position (a `FitState`), checkpoints and
auto-resume of the whole pytree, callbacks, evaluation through a `StepLike`, continuation."""

import uuid

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import functrain
from functrain.checkpoint import Manager, load
from functrain.data import Loader
from functrain.step.protocol import Evaluator
from functrain.tree import leaves_with_paths


def two_models(seed=0, lr_a=None):
    torch.manual_seed(seed)
    a, b = nn.Linear(3, 1), nn.Linear(3, 1)
    if lr_a is None:
        lr_a = 0.1 * functrain.schedules.linear(alpha_f=0.1, t_max="1dur")
    opt_a = functrain.optim.adamw(lr=lr_a)
    opt_b = functrain.optim.sgd(lr=0.05)

    def mse(model, batch):
        x, y = batch
        return F.mse_loss(model(x), y)

    steps = functrain.make_step(a, mse, opt_a), functrain.make_step(b, mse, opt_b)
    states = {"a": functrain.init(a, opt_a, seed=1), "b": functrain.init(b, opt_b, seed=2)}
    return steps, states


def make_pair_step(steps):
    step_a, step_b = steps

    def pair_step(states, batch):
        """Model a on the batch, then b on the same batch with a's prediction as its target."""
        a, ma = step_a(states["a"], batch)
        x, _ = batch
        target = step_a.pieces.call_model(a, x)
        b, mb = step_b(states["b"], (x, target))
        return {"a": a, "b": b}, {"loss_a": ma["loss"], "loss_b": mb["loss"]}

    return pair_step


def data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))


def tensors(tree):
    return {p: v for p, v in leaves_with_paths(tree) if isinstance(v, torch.Tensor)}


def test_a_pytree_of_states_trains_as_the_hand_written_loop():
    steps, states = two_models()
    pair = make_pair_step(steps)
    run = functrain.fit(pair, states, Loader(data(), 8, seed=4), duration="3ep", progress=False)
    assert isinstance(run, functrain.FitState)
    ts = run.timestamp
    assert (ts.epoch, ts.batch, ts.sample, ts.max_batches) == (3, 15, 120, 15)
    # the same updates by hand: the Loader's batches in its order, the step called directly
    steps, expected = two_models()
    pair, loader = make_pair_step(steps), Loader(data(), 8, seed=4)
    expected = {k: v.replace(timestamp=v.timestamp.replace(max_batches=15, batches_per_epoch=5))
                for k, v in expected.items()}  # fmt: skip  # the horizon fit shares ("1dur")
    for epoch in range(3):
        for batch in loader.epoch_iter(epoch, 0):
            expected, _ = pair(expected, batch)
    for key, value in tensors(expected).items():
        assert torch.equal(tensors(run.states)[key], value), key
    assert run.states["a"].timestamp.max_batches == 15  # the horizon reached the inner states


def test_callbacks_see_the_fit_state_and_the_loops_position():
    seen = []

    class Watch:
        def batch_end(self, ctx):
            seen.append(
                (ctx.timestamp.batch, ctx.state.states["a"].step, float(ctx.metrics["loss_b"]))
            )

    steps, states = two_models()
    functrain.fit(make_pair_step(steps), states, Loader(data(), 8), duration="4ba",
                  callbacks=[Watch()], progress=False)  # fmt: skip
    assert [(b, s) for b, s, _ in seen] == [(1, 1), (2, 2), (3, 3), (4, 4)]


def test_a_frozen_state_and_any_pytree_leaves_pass_through():
    steps, states = two_models()
    step_a, _ = steps
    frozen = tensors(states["b"])
    frozen = {k: v.clone() for k, v in frozen.items()}

    def train_a_only(states, batch):
        a, metrics = step_a(states["a"], batch)
        return {**states, "a": a}, metrics

    states["note"] = torch.tensor(7.0)
    run = functrain.fit(train_a_only, states, Loader(data(), 8), duration="1ep", progress=False)
    assert run.timestamp.batch == 5 and run.states["a"].step == 5 and run.states["b"].step == 0
    for key, value in frozen.items():
        assert torch.equal(tensors(run.states["b"])[key], value)
    assert float(run.states["note"]) == 7.0


class StopAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            ctx.request_stop("stop here")


def test_mid_epoch_checkpoint_and_autoresume_are_bit_identical():
    steps, states = two_models()
    full = functrain.fit(make_pair_step(steps), states, Loader(data(), 8, seed=2),
                         duration="3ep", progress=False)  # fmt: skip
    root = f"memory://test_fit_multi/{uuid.uuid4().hex}"
    steps, states = two_models()
    with Manager(root, every="4ba", keep_last=None) as manager:
        stopped = functrain.fit(make_pair_step(steps), states, Loader(data(), 8, seed=2),
                                duration="3ep", checkpoints=manager, callbacks=[StopAt(7)],
                                progress=False)  # fmt: skip
        assert [s for s, _ in manager.checkpoints()] == [4, 7]  # the step number: loop batches
    assert stopped.timestamp.batch_in_epoch == 2
    saved = load(f"{root}/step_000000007")
    assert saved["timestamp.batch"] == 7 and "states.a.params.weight" in saved
    assert "extra.data" in saved  # the Loader's fingerprint, for a mid-epoch resume
    steps, states = two_models(seed=9)  # other weights: all of it comes from the checkpoint
    with Manager(root, every="4ba", keep_last=None) as manager:
        result = functrain.fit(make_pair_step(steps), states, Loader(data(), 8, seed=2),
                               duration="3ep", checkpoints=manager, autoresume=True,
                               return_result=True, progress=False)  # fmt: skip
    assert result.resumed_from.endswith("step_000000007") and result.finished
    assert tensors(result.state).keys() == tensors(full).keys()
    for key, value in tensors(full).items():
        if key != "timestamp.elapsed_sec":
            assert torch.equal(tensors(result.state)[key], value), key


def test_a_fit_state_continues_with_a_longer_duration():
    steps, states = two_models(lr_a=0.1)  # no "dur" schedule: the split run equals one run
    once = functrain.fit(make_pair_step(steps), states, Loader(data(), 8), duration="2ep",
                         progress=False)  # fmt: skip
    steps, states = two_models(lr_a=0.1)
    half = functrain.fit(make_pair_step(steps), states, Loader(data(), 8), duration="1ep",
                         progress=False)  # fmt: skip
    assert half.timestamp.epoch == 1
    twice = functrain.fit(make_pair_step(steps), half, Loader(data(), 8), duration="2ep",
                          progress=False)  # fmt: skip
    assert twice.timestamp.batch == 10 and twice.states["a"].timestamp.max_batches == 10
    for key, value in tensors(once.states).items():
        assert torch.equal(tensors(twice.states)[key], value), key


class PairWithEvaluator:
    """A StepLike over the pair whose evaluation runs model a."""

    def __init__(self, steps):
        self.steps, self.fn = steps, make_pair_step(steps)

    def __call__(self, states, batch):
        return self.fn(states, batch)

    def donated(self):
        return self

    def init_state(self, states):
        return states

    def evaluator(self):
        a = self.steps[0].evaluator()
        return Evaluator(a.module, lambda s, *args: a.call_model(s["a"], *args), a.loss_fn)


def test_evaluation_runs_through_the_steps_evaluator_and_eval_state_fn():
    steps, states = two_models()
    results = []

    class Grab:
        def eval_end(self, ctx):
            results.append(dict(ctx.eval_metrics))

    swapped = []

    def use_b_weights(s):  # evaluate b's weights in a's place
        swapped.append(True)
        return {**s, "a": s["a"].replace(params=s["b"].params)}

    run = functrain.fit(PairWithEvaluator(steps), states, Loader(data(), 8), duration="1ep",
                        eval_data=[data()[:40]], eval_state_fn=use_b_weights,
                        callbacks=[Grab()], progress=False)  # fmt: skip
    x, y = data()[:40]
    b = run.states["b"].params
    expected = float(F.mse_loss(x @ b["weight"].T + b["bias"], y))
    assert swapped and results[-1]["loss"] == pytest.approx(expected, rel=1e-6)
