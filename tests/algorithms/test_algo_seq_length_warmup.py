"""seq_length_warmup transform: a tiny language model sees the warm-up lengths; resumes exactly."""

import pytest
import torch
import torch.nn.functional as F

import functrain
from functrain import optim
from functrain.algorithms.seq_length_warmup import seq_length_warmup
from functrain.functional.seq_length_warmup import warmup_sequence_length
from functrain.tree import tree_clone

VOCAB = 16


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def lm_loss(model, batch):
    ids = batch["input_ids"]
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)), {
        "length": ids.shape[1]
    }


def _batches(n=3):
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):  # a learnable pattern: each token is the previous one plus one
        start = torch.randint(0, VOCAB, (8, 1), generator=gen)
        ids = (start + torch.arange(32)) % VOCAB
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return out


def _setup(max_batches, **kwargs):
    torch.manual_seed(0)
    model = TinyLM()
    opt = optim.adamw(lr=5e-2)
    state = functrain.init(model, opt, seed=0)
    state = state.replace(timestamp=state.timestamp.replace(max_batches=max_batches))
    algorithm = seq_length_warmup(
        duration=0.5, min_seq_length=4, max_seq_length=32, step_size=4, **kwargs
    )
    return functrain.compose(functrain.make_step(model, lm_loss, opt), algorithm), state


def _run(step, state, batches, n):
    lengths, losses = [], []
    for _ in range(n):
        state, metrics = step(state, batches[state.step % len(batches)])
        lengths.append(metrics["length"])
        losses.append(float(metrics["loss"]))
    return state, lengths, losses


def test_lengths_follow_the_warmup_schedule_and_training_progresses():
    step, state = _setup(max_batches=10)
    _, lengths, losses = _run(step, state, _batches(), 10)
    assert lengths == [warmup_sequence_length(b, 10, 0.5, 4, 32, 4) for b in range(10)]
    assert lengths[0] == 4 and lengths[-1] == 32 and lengths == sorted(lengths)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_reshaping_mode_keeps_all_tokens_in_more_rows():
    step, state = _setup(max_batches=10, truncate=False)
    prepared = step.pieces.prepare(state, _batches(1)[0])
    assert prepared["input_ids"].shape == (64, 4)


def test_resumes_exactly():
    batches = _batches()
    step, state0 = _setup(max_batches=6)
    full, _, _ = _run(step, tree_clone(state0), batches, 6)
    half, _, _ = _run(step, tree_clone(state0), batches, 3)
    fresh, _ = _setup(max_batches=6)
    resumed, _, _ = _run(fresh, tree_clone(half), batches, 3)
    for name in full.params:
        assert torch.equal(resumed.params[name], full.params[name]), name


def test_bad_arguments_and_unknown_run_length():
    with pytest.raises(ValueError, match="max_seq_length"):
        seq_length_warmup(min_seq_length=64, max_seq_length=8)
    step, state = _setup(max_batches=0)
    with pytest.raises(ValueError, match="run's length"):
        step.pieces.prepare(state, _batches(1)[0])
