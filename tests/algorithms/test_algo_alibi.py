"""alibi: surgery + training on shorter rows of the same tokens."""

import pytest
import torch
from _algo_model_helpers import assert_pure, assert_resume_exact, make, run

import functrain
from functrain import optim
from functrain.algorithms import alibi, apply_surgery
from functrain.models import GPT, GPTConfig, gpt_loss

OPT = optim.adamw(3e-3)


def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=16))


def token_batches(n, length=16, rows=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(0, 16, (rows, length + 1), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def test_trains_on_shorter_rows_and_evaluates_longer():
    algorithm = alibi(max_sequence_length=64, train_sequence_length_scaling=0.25)
    model = apply_surgery(gpt(), [algorithm])
    assert model.wpe is None and model.max_sequence_length == 64
    step = make(model, gpt_loss, lambda: [algorithm], OPT)
    state, metrics = step(functrain.init(model, OPT), token_batches(1)[0])
    assert metrics["outputs"].shape == (16, 4, 16)  # 4 rows of 16 -> 16 rows of 4
    assert metrics["samples"] == 16
    logits = step.call_model(state, torch.zeros(2, 48, dtype=torch.long))
    assert logits.shape == (2, 48, 16)


def test_training_reduces_the_loss():
    algorithm = alibi(max_sequence_length=32, train_sequence_length_scaling=0.5)
    model = apply_surgery(gpt(), [algorithm])
    batch = token_batches(1)[0]
    step = make(model, gpt_loss, lambda: [algorithm], OPT)
    state = functrain.init(model, OPT)
    _, first = step(state, batch)
    _, last = run(step, state, [batch] * 15)
    assert float(last["loss"]) < float(first["loss"]) - 0.3


def test_pure_and_resumable():
    def factory():
        return [alibi(max_sequence_length=32, train_sequence_length_scaling=0.5)]

    model = apply_surgery(gpt(), factory())
    state = functrain.init(model, OPT)
    batches = token_batches(4)
    assert_pure(make(model, gpt_loss, factory, OPT), state, batches[0])
    assert_resume_exact(model, gpt_loss, factory, state, batches, opt=OPT)


def test_errors():
    with pytest.raises(ValueError, match="train_sequence_length_scaling"):
        alibi(train_sequence_length_scaling=0.0)
    with pytest.raises(ValueError, match="no attention module"):
        apply_surgery(torch.nn.Linear(2, 2), [alibi()])
