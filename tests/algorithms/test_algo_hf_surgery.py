"""ALiBi and gated linear units on Hugging Face GPT-2 and BERT through `fit`: the surgery trains,
checkpoints, resumes bit-identically, and exports weights a fresh surgered model loads strictly."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import safetensors.torch  # noqa: E402

import functrain  # noqa: E402
from functrain.algorithms import alibi, apply_surgery, gated_linear_units  # noqa: E402
from functrain.checkpoint import Manager  # noqa: E402
from functrain.data import Loader  # noqa: E402

VOCAB, LENGTH = 24, 16


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, n_positions=LENGTH, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def bert(cls):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=2,
    )  # fmt: skip
    return getattr(transformers, cls)(config)


def sequences(n=96, seed=0):
    """Arithmetic progressions mod VOCAB: learnable from the previous tokens alone."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    return (start + stride * torch.arange(LENGTH)) % VOCAB, stride.squeeze(1)


def lm_loss(model, batch):
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss


def mlm_loss(model, batch):
    ids, labels = batch
    return model(input_ids=ids, labels=labels).loss


def classify_loss(model, batch):
    ids, mask, labels = batch
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def case(name):
    """(surgered model factory, loss, dataset, algorithms) for one model family."""
    ids, stride = sequences()
    if name == "gpt2":
        algorithms = [alibi(max_sequence_length=64, train_sequence_length_scaling=0.5)]
        return gpt2, lm_loss, torch.utils.data.TensorDataset(ids), algorithms
    if name == "bert_mlm":
        masked = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.25
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        inputs = torch.where(masked, torch.zeros_like(ids), ids)  # token 0 as [MASK]
        algorithms = [alibi(max_sequence_length=64, train_sequence_length_scaling=0.5)]
        data = torch.utils.data.TensorDataset(inputs, labels)
        return (lambda: bert("BertForMaskedLM")), mlm_loss, data, algorithms
    mask = torch.ones_like(ids)
    mask[::3, 12:] = 0  # some padded rows
    data = torch.utils.data.TensorDataset(ids, mask, (stride > 1).long())
    algorithms = [alibi(max_sequence_length=64, train_sequence_length_scaling=1.0)]
    return (lambda: bert("BertForSequenceClassification")), classify_loss, data, algorithms


def build(name):
    factory, loss_fn, data, algorithms = case(name)
    algorithms = [*algorithms, gated_linear_units()]
    model = apply_surgery(factory(), algorithms)
    optimizer = functrain.optim.adamw(lr=3e-3)
    state = functrain.init(model, optimizer, seed=0)
    step = functrain.compose(functrain.make_step(model, loss_fn, optimizer), *algorithms)
    return model, step, state, Loader(data, batch_size=16, seed=0)


class Losses:
    def __init__(self):
        self.values = []

    def batch_end(self, ctx):
        self.values.append(float(ctx.metrics["loss"]))


@pytest.mark.parametrize("name", ["gpt2", "bert_mlm", "bert_classify"])
def test_surgered_hf_model_trains_checkpoints_resumes_and_exports(name, tmp_path):
    model, step, state, loader = build(name)
    kinds = {type(m).__name__ for m in model.modules()}
    assert kinds & {"ALiBiGPT2Attention", "ALiBiBertSelfAttention"}
    assert kinds & {"GLUMLP", "BERTGatedFFOutput"}
    losses = Losses()
    full = functrain.fit(
        step, state, loader, duration="12ba", callbacks=[losses], log_interval=None
    )
    first, last = sum(losses.values[:3]) / 3, sum(losses.values[-3:]) / 3
    assert last < first, losses.values  # it learns

    # Six batches, a checkpoint, and a fresh process-like restart for the other six.
    _, step_a, state_a, loader_a = build(name)
    with Manager(tmp_path / "ckpt", every="6ba") as manager:
        functrain.fit(step_a, state_a, loader_a, duration="6ba", checkpoints=manager)
    _, step_b, state_b, loader_b = build(name)
    with Manager(tmp_path / "ckpt", every="6ba") as manager:
        resumed = functrain.fit(
            step_b, state_b, loader_b, duration="12ba", checkpoints=manager, autoresume=True
        )
    assert resumed.step == full.step == 12
    for key, value in full.params.items():
        assert torch.equal(value, resumed.params[key]), key  # bit-identical

    ids = loader.dataset.tensors[0][:4]
    model.eval()
    model.config.use_cache = False  # GPT-2 would return its KV cache, which torch.export rejects
    paths = functrain.export(full, tmp_path / "export", model=model, example_inputs=(ids,))
    fresh, _, _, _ = build(name)
    fresh.load_state_dict(safetensors.torch.load_file(paths["safetensors"]), strict=True)
    fresh.eval()
    program = torch.export.load(paths["program"]).module()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        torch.testing.assert_close(fresh(input_ids=ids).logits, expected)
        torch.testing.assert_close(program(ids).logits, expected)
