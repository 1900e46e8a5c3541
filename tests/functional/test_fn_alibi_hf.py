"""ALiBi on Hugging Face GPT-2 and BERT (the installed transformers), against a hand-computed
attention: every attention module on the model's own forward path must give what an explicit loop
over heads, queries and keys gives, with the linear biases of Press et al."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from functrain.functional import alibi_slopes, apply_alibi  # noqa: E402

VOCAB = 40


def gpt2(attn="sdpa", **overrides):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, n_positions=16,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation=attn, **overrides,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def bert(cls="BertForMaskedLM", attn="sdpa"):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=3, attn_implementation=attn,
    )  # fmt: skip
    return getattr(transformers, cls)(config).eval()


def reference_attention(q, k, v, slopes, causal, key_mask=None):
    """Explicit loops: out[b, i, h] = sum_j softmax_j(q.k / sqrt(d) + bias(h, i, j)) v[b, j, h].

    q, k, v: (batch, length, heads, head_dim); key_mask: (batch, length) of 1 = attend.
    """
    q, k, v = q.detach(), k.detach(), v.detach()
    batch, length, heads, dim = q.shape
    out = torch.zeros_like(q, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                scores, values = [], []
                for j in range(length):
                    if causal and j > i:
                        continue
                    if key_mask is not None and key_mask[b, j] == 0:
                        continue
                    distance = i - j if causal else abs(i - j)
                    score = float(q[b, i, h] @ k[b, j, h]) / math.sqrt(dim)
                    scores.append(score - float(slopes[h]) * distance)
                    values.append(v[b, j, h].double())
                weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
                out[b, i, h] = sum(w * x for w, x in zip(weights, values))
    return out.reshape(batch, length, heads * dim)


def capture(model, kind):
    """Record (input hidden states, output) of every `kind` module on the forward path."""
    seen = []
    hooks = [
        m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0], out[0])))
        for m in model.modules()
        if type(m).__name__ == kind
    ]
    return seen, hooks


def gpt2_qkv(attn, x):
    q, k, v = (x @ attn.c_attn.weight + attn.c_attn.bias).split(attn.split_size, dim=-1)
    shape = (*x.shape[:-1], attn.num_heads, attn.head_dim)
    return q.view(shape), k.view(shape), v.view(shape)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gpt2_attention_is_alibi_attention_on_the_models_forward_path(attn):
    model = apply_alibi(gpt2(attn), max_sequence_length=64)
    ids = torch.randint(0, VOCAB, (2, 20))  # longer than the original 16 positions
    seen, hooks = capture(model, "ALiBiGPT2Attention")
    logits = model(ids).logits
    assert logits.shape == (2, 20, VOCAB) and len(seen) == 2
    for attention, x, out in seen:
        q, k, v = gpt2_qkv(attention, x)
        expected = reference_attention(q, k, v, alibi_slopes(4), causal=True)
        expected = expected.float() @ attention.c_proj.weight + attention.c_proj.bias
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for hook in hooks:
        hook.remove()


def test_gpt2_position_embeddings_are_zeroed_frozen_and_extended():
    original = gpt2()
    model = apply_alibi(original, max_sequence_length=64)
    wpe = model.transformer.wpe.weight
    assert wpe.shape == (64, 32) and not wpe.requires_grad and not wpe.any()
    assert original.transformer.wpe.weight.any()  # the input model is untouched
    assert type(original.transformer.h[0].attn).__name__ == "GPT2Attention"
    assert model.transformer.h[0].attn.alibi_slopes.tolist() == alibi_slopes(4).tolist()
    # Only the bias carries position: without it, a token's logits would not depend on where it is.
    ids = torch.tensor([[3, 5, 5, 5]])
    logits = model(ids).logits
    assert not torch.allclose(logits[0, 1], logits[0, 3], atol=1e-4)


def test_gpt2_causal_with_padding_and_incremental_decoding():
    model = apply_alibi(gpt2(), max_sequence_length=64)
    ids = torch.randint(0, VOCAB, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second row
    seen, hooks = capture(model, "ALiBiGPT2Attention")
    model(ids, attention_mask=mask)
    for attention, x, out in seen:
        q, k, v = gpt2_qkv(attention, x)
        expected = reference_attention(q, k, v, alibi_slopes(4), causal=True, key_mask=mask)
        expected = expected.float() @ attention.c_proj.weight + attention.c_proj.bias
        torch.testing.assert_close(out[0], expected[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out[1, 3:], expected[1, 3:], rtol=1e-4, atol=1e-5)
    for hook in hooks:
        hook.remove()
    # With a cache, the new query is position 11 of 12: the same logits as the full forward.
    full = model(ids[:, :12]).logits[:, -1]
    prefix = model(ids[:, :11], use_cache=True)
    last = model(ids[:, 11:], cache=prefix.past_key_values, use_cache=True).logits[:, -1]
    torch.testing.assert_close(last, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_bert_self_attention_is_bidirectional_alibi_with_padding(cls):
    model = apply_alibi(bert(cls), max_sequence_length=64)
    ids = torch.randint(0, VOCAB, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 15:] = 0  # right padding
    seen, hooks = capture(model, "ALiBiBertSelfAttention")
    out_all = model(ids, attention_mask=mask)
    assert out_all.logits.shape == ((2, 20, VOCAB) if cls == "BertForMaskedLM" else (2, 3))
    assert len(seen) == 2
    for attention, x, out in seen:
        shape = (*x.shape[:-1], 4, 8)
        q, k, v = (
            layer(x).view(shape) for layer in (attention.query, attention.key, attention.value)
        )
        expected = reference_attention(q, k, v, alibi_slopes(4), causal=False, key_mask=mask)
        torch.testing.assert_close(out, expected.float(), rtol=1e-4, atol=1e-5)
    for hook in hooks:
        hook.remove()
    embeddings = model.bert.embeddings
    assert embeddings.position_embeddings.weight.shape == (64, 32)
    assert not embeddings.position_embeddings.weight.any()


def test_unsupported_attention_is_rejected_with_the_supported_list():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_layer=1, n_head=2, n_embd=16)
    with pytest.raises(ValueError, match="GPT2Attention and BertSelfAttention"):
        apply_alibi(transformers.GPT2LMHeadModel(config).transformer.wte, 32)
    with pytest.raises(TypeError, match="optimizers="):
        apply_alibi(gpt2(), 32, optimizers=torch.optim.SGD(gpt2().parameters(), lr=0.1))


def test_config_reports_the_new_maximum_length():
    original = gpt2()
    model = apply_alibi(original, max_sequence_length=64)
    assert model.config.n_positions == 64 and original.config.n_positions == 16
    encoder = apply_alibi(bert(), max_sequence_length=48)
    assert encoder.config.max_position_embeddings == 48


def test_alibi_attention_takes_a_two_dimensional_padding_mask():
    from functrain.functional.alibi_hf import alibi_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))  # (batch, heads, length, head_dim)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # (batch, keys) of 1 = attend
    slopes = alibi_slopes(3)
    for causal in (False, True):
        out = alibi_attention(q, k, v, mask, slopes, causal=causal, scale=0.5)  # 1 / sqrt(4)
        expected = reference_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), slopes, causal, key_mask=mask
        )
        torch.testing.assert_close(out.reshape(2, 5, 12), expected.float(), rtol=1e-4, atol=1e-5)


def test_attention_dropout_acts_in_training_only():
    ids = torch.randint(0, VOCAB, (1, 6))
    for model, kind in (
        (apply_alibi(gpt2(), 32), "ALiBiGPT2Attention"),
        (apply_alibi(bert(), 32), "ALiBiBertSelfAttention"),
    ):
        for m in model.modules():
            if type(m).__name__ == kind:
                (m.attn_dropout if kind == "ALiBiGPT2Attention" else m.dropout).p = 0.5
        model.eval()
        first, second = model(ids).logits, model(ids).logits
        assert torch.equal(first, second)  # eval: no dropout, deterministic
        model.train()
        torch.manual_seed(1)
        third = model(ids).logits
        assert not torch.allclose(third, first)  # training: the attention weights are dropped


def test_bert_state_dict_keeps_the_original_names():
    original = bert()
    new = apply_alibi(original, max_sequence_length=48)
    # The original names, plus one `alibi_slopes` buffer per attention; `position_ids` (rebuilt
    # for the new length) stays out of the state dict, as in transformers.
    slopes = {f"bert.encoder.layer.{i}.attention.self.alibi_slopes" for i in range(2)}
    assert set(new.state_dict()) == set(original.state_dict()) | slopes
    assert new.bert.embeddings.position_ids.shape == (1, 48)


def test_without_transformers_imported_no_model_is_a_hugging_face_one(monkeypatch):
    import sys

    from functrain.functional.alibi_hf import is_hf_model
    from functrain.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    monkeypatch.delitem(sys.modules, "transformers")  # as in a process that never imported it
    assert is_hf_model(model) is False
    assert apply_alibi(model, max_sequence_length=16).wpe is None
