"""Tests of functrain.loop.evaluation: evaluate and predict with a Step or a plain module, and their
re-exports from functrain.loop and functrain."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import functrain
import functrain.loop
import functrain.loop.evaluation
from functrain.data import Loader
from functrain.loop.evaluation import describe_batch, evaluate, predict


def test_evaluate_and_predict_are_re_exported_from_the_loop_and_the_package():
    assert functrain.loop.evaluate is evaluate is functrain.evaluate
    assert functrain.loop.predict is predict is functrain.predict
    assert (
        describe_batch((torch.zeros(2, 3), [1]))
        == "tuple of 2: Tensor[2, 3] float32, list of 1: int"
    )


def test_evaluate_and_predict_with_a_step_and_a_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    opt = functrain.optim.sgd(lr=0.1)
    state = functrain.init(model, opt)

    def ce_loss(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    step = functrain.make_step(model, ce_loss, opt)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 4, generator=gen), torch.randint(0, 3, (20,), generator=gen)
    data = Loader(TensorDataset(x, y), 6, shuffle=False, drop_last=False)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    model.train()
    expected = {
        "loss": F.cross_entropy(logits, y).item(),
        "accuracy": (logits.argmax(-1) == y).double().mean().item(),
    }
    by_step = evaluate(step, state, data, metrics=["accuracy"])
    assert by_step == pytest.approx(expected, rel=1e-5)
    by_module = evaluate(model, state, data, metrics=["accuracy"])
    assert by_module == pytest.approx({"accuracy": expected["accuracy"]})
    assert model.training  # the mode is restored after evaluation
    outputs = predict(step, state, data)
    assert torch.allclose(torch.cat(outputs), logits, atol=1e-6)
    custom = evaluate(step, state, data, metrics={"acc": "accuracy"},
                      eval_fn=lambda m, b: (m(b[0]), b[1]))  # fmt: skip
    assert custom["acc"] == pytest.approx(expected["accuracy"])
