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
    # by hand: 5 warm-up batches, 7 increments of 4 -> one increment per batch (at least one),
    # so 4, 8, ..., 32 over the first 8 batches, then 32
    assert lengths == [4, 8, 12, 16, 20, 24, 28, 32, 32, 32]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize(
    "max_batches, expected",
    [
        # 20 warm-up batches, 7 increments of 4: one every 20 // 7 = 2 batches
        (40, [4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28, 32, 32, 32]),
        # 30 warm-up batches: one increment every 30 // 7 = 4 batches, 32 from batch 28 on
        (60, [4] * 4 + [8] * 4 + [12] * 4 + [16] * 4 + [20] * 4 + [24] * 4 + [28] * 4 + [32] * 3),
        # 3 warm-up batches: fewer than the increments, one per batch
        (6, [4, 8, 12, 16, 20, 24, 28, 32, 32]),
    ],
)
def test_warmup_lengths_by_hand(max_batches, expected):
    assert [
        warmup_sequence_length(b, max_batches, 0.5, 4, 32, 4) for b in range(len(expected))
    ] == expected


def test_truncation_keeps_the_first_tokens_of_every_row():
    step, state = _setup(max_batches=40)
    batch = _batches(1)[0]
    state = state.replace(step=2, timestamp=state.timestamp.replace(batch=2))  # length 8
    prepared = step.pieces.prepare(state, batch)
    assert torch.equal(prepared["input_ids"], batch["input_ids"][:, :8])
    assert torch.equal(prepared["attention_mask"], batch["attention_mask"][:, :8])


def test_reshaping_mode_keeps_all_tokens_in_more_rows():
    step, state = _setup(max_batches=10, truncate=False)
    batch = _batches(1)[0]
    prepared = step.pieces.prepare(state, batch)
    # 8 rows of 32 tokens cut into rows of 4, in order: row r, tokens 4k..4k+3 -> row 8r + k
    expected = torch.stack(
        [batch["input_ids"][r, 4 * k : 4 * k + 4] for r in range(8) for k in range(8)]
    )
    assert torch.equal(prepared["input_ids"], expected)


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
