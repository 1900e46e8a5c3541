"""The small GPT: shapes, causality, tied head, config checks, and it learns."""

import pytest
import torch

import functrain
from functrain import optim
from functrain.models import GPT, GPTConfig, gpt_loss


def small(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, n_embd=16, **kw))


def test_shapes_and_tied_head():
    model = small()
    assert model(torch.zeros(3, 10, dtype=torch.long)).shape == (3, 10, 12)
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "wte.weight" in names and "lm_head.weight" not in names  # one name per tied tensor


def test_causal_the_past_ignores_the_future():
    model = small().eval()
    x = torch.randint(0, 12, (2, 16))
    y = x.clone()
    y[:, 9:] = (y[:, 9:] + 3) % 12
    torch.testing.assert_close(model(x)[:, :9], model(y)[:, :9])
    assert not torch.allclose(model(x)[:, 9:], model(y)[:, 9:])


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="longer"):
        small()(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, length"):
        small()(torch.zeros(17, dtype=torch.long))


def test_learns_a_repeating_sequence_with_the_step():
    model = small(dropout=0.1)
    opt = optim.adamw(1e-2)
    step = functrain.make_step(model, gpt_loss, opt)
    state = functrain.init(model, opt)
    seq = torch.arange(17).remainder(12).repeat(4, 1)
    batch = {"input_ids": seq[:, :-1], "labels": seq[:, 1:]}
    losses = []
    for _ in range(25):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0]
