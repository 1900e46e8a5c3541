"""ModelCalls: model calls recorded in order and replayed by position when the arguments are the
same objects; what evaluation and the mixed-target losses share a forward pass through."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain import optim
from functrain.algorithms import label_smoothing
from functrain.data import Loader
from functrain.step.model_calls import ModelCalls


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 2)
        self.drop = torch.nn.Dropout(0.5)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.drop(self.fc(x))


@settings(max_examples=20, deadline=None)
@given(pattern=st.lists(st.sampled_from(["x", "y", "new"]), min_size=1, max_size=5))
def test_replay_returns_the_kth_recorded_outputs_exactly_when_the_kth_arguments_are_the_same(
    pattern,
):
    model = Counting()
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    inputs = {"x": x, "y": y}
    calls = ModelCalls(model)
    recorded = [calls(inputs[p] if p != "new" else torch.randn(4, 3)) for p in pattern]
    assert model.calls == len(pattern)  # recording always runs the model
    calls.replay()
    for k, p in enumerate(pattern):
        arg = inputs[p] if p != "new" else torch.randn(4, 3)
        before = model.calls
        out = calls(arg)
        if p != "new":
            assert out is recorded[k] and model.calls == before
        else:
            assert model.calls == before + 1  # a new tensor never matches, even by value


def test_a_loss_that_calls_the_model_twice_keeps_both_passes():
    model = Counting()  # dropout on: two calls draw two masks
    x = torch.randn(16, 3)
    calls = ModelCalls(model)
    first, second = calls(x), calls(x)
    assert not torch.equal(first, second)  # recording never merges calls
    calls.replay()
    assert calls(x) is first and calls(x) is second
    assert calls(x) is not first and model.calls == 3  # past the recording: runs again


def test_equal_values_in_a_new_tensor_are_not_replayed_and_ids_are_never_reused():
    model = Counting().eval()
    x = torch.randn(4, 3)
    calls = ModelCalls(model)
    calls(x * 2)  # a temporary: ModelCalls keeps it alive, so its id cannot be reused
    calls.replay()
    out = calls(x * 3)
    assert torch.allclose(out, model(x * 3))
    assert calls.fc is model.fc  # attributes reach the model
    calls.reset()
    calls(x)
    calls.replay()
    before = model.calls
    calls(x.clone())  # equal values, another tensor: identity decides, never a device compare
    assert model.calls == before + 1


def test_evaluate_metrics_use_the_first_call_of_the_loss_and_eval_fn_shares_it():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt)
    forwards = []

    def two_call_loss(m, batch):
        x, y = batch
        logits = m(x)  # the metrics' outputs
        forwards.append(1)
        return F.cross_entropy(logits, y) + 0.0 * m(x * 0).sum()

    step = functrain.make_step(model, two_call_loss, opt)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=gen), torch.randint(0, 3, (12,), generator=gen)
    data = Loader(torch.utils.data.TensorDataset(x, y), 6, shuffle=False, drop_last=False)
    with torch.no_grad():
        expected = (model(x).argmax(-1) == y).double().mean().item()
    got = functrain.evaluate(step, state, data, metrics=["accuracy"])
    assert got["accuracy"] == pytest.approx(expected)  # not the outputs of m(x * 0)
    got = functrain.evaluate(
        step, state, data, metrics=["accuracy"], eval_fn=lambda m, b: (m(b[0]), b[1])
    )
    assert got["accuracy"] == pytest.approx(expected)


def test_label_smoothing_runs_the_forward_once_per_microbatch():
    model = Counting().eval()
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt)
    step = functrain.compose(
        functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), opt),
        label_smoothing(0.1),
    )
    model.calls = 0
    step(state, (torch.randn(8, 3), torch.randint(0, 2, (8,))))
    assert model.calls == 1  # the primary loss records it; the smoothed term replays it
