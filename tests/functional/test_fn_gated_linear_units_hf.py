"""Gated linear units on Hugging Face BERT (Composer's BERTGatedFFOutput, its state-dict names) and
GPT-2 (functrain's GLUMLP), checked against hand-written matrix products of the new weights."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from functrain.functional import apply_gated_linear_units  # noqa: E402

VOCAB = 40


def bert(cls="BertForMaskedLM"):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=3,
    )  # fmt: skip
    return getattr(transformers, cls)(config).eval()


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def test_bert_feed_forward_is_composers_gated_block():
    original = bert()
    model = apply_gated_linear_units(original)
    layer, before = model.bert.encoder.layer[0], original.bert.encoder.layer[0]
    assert type(layer.intermediate) is torch.nn.Identity
    glu = layer.output
    assert type(glu).__name__ == "BERTGatedFFOutput"
    # Starts from the original weights: value <- intermediate.dense, wo <- output.dense.
    assert torch.equal(glu.non_gated_layer.weight, before.intermediate.dense.weight)
    assert torch.equal(glu.wo.weight, before.output.dense.weight)
    assert torch.equal(glu.layernorm.weight, before.output.LayerNorm.weight)
    assert glu.gated_layer.bias is None and glu.non_gated_layer.bias is None
    x, residual = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    hidden = F.gelu(x @ glu.gated_layer.weight.T) * (x @ glu.non_gated_layer.weight.T)
    expected = F.layer_norm(
        hidden @ glu.wo.weight.T + glu.wo.bias + residual, (32,),
        glu.layernorm.weight, glu.layernorm.bias, eps=1e-12,
    )  # fmt: skip
    torch.testing.assert_close(glu(x, residual), expected)
    ids = torch.randint(0, VOCAB, (2, 7))
    assert model(ids).logits.shape == (2, 7, VOCAB)
    assert type(original.bert.encoder.layer[0].output).__name__ == "BertOutput"  # untouched


def test_bert_state_dict_has_composers_names_and_loads_strictly():
    model = apply_gated_linear_units(bert("BertForSequenceClassification"))
    keys = set(model.state_dict())
    prefix = "bert.encoder.layer.1.output."
    composer_names = {  # composer/algorithms/gated_linear_units/gated_linear_unit_layers.py
        prefix + n
        for n in (
            "gated_layer.weight",
            "non_gated_layer.weight",
            "wo.weight",
            "wo.bias",
            "layernorm.weight",
            "layernorm.bias",
        )
    }
    assert composer_names <= keys
    assert not any(re.search(r"layer\.\d+\.(intermediate|output\.dense)\.", k) for k in keys)
    # A state dict saved under those names (as Composer writes it) loads with strict=True.
    saved = {
        k: torch.randn_like(v) if v.is_floating_point() else v
        for k, v in model.state_dict().items()
    }
    fresh = apply_gated_linear_units(bert("BertForSequenceClassification"))
    fresh.load_state_dict(saved, strict=True)
    assert torch.equal(fresh.bert.encoder.layer[1].output.wo.weight, saved[prefix + "wo.weight"])


def test_gpt2_mlp_becomes_a_glu_from_the_conv1d_weights():
    original = gpt2()
    model = apply_gated_linear_units(original, non_gated_layer_bias=True)
    mlp, before = model.transformer.h[0].mlp, original.transformer.h[0].mlp
    assert type(mlp).__name__ == "GLUMLP"
    assert torch.equal(mlp.value.weight, before.c_fc.weight.T)  # Conv1D keeps (in, out)
    assert torch.equal(mlp.value.bias, before.c_fc.bias)
    assert torch.equal(mlp.proj.weight, before.c_proj.weight.T)
    x = torch.randn(2, 5, 32)
    gelu_new = transformers.activations.NewGELUActivation()
    hidden = gelu_new(x @ mlp.gate.weight.T) * (x @ mlp.value.weight.T + mlp.value.bias)
    torch.testing.assert_close(mlp(x), hidden @ mlp.proj.weight.T + mlp.proj.bias)
    assert model(torch.randint(0, VOCAB, (2, 7))).logits.shape == (2, 7, VOCAB)


def test_composers_positional_optimizers_are_rejected_with_the_fix():
    model = bert()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"optimizers=.*functrain.init"):
        apply_gated_linear_units(
            model, optimizer
        )  # Composer's apply_gated_linear_units(model, opt)
    with pytest.raises(TypeError, match=r"optimizers=.*functrain.init"):
        apply_gated_linear_units(model, optimizers=[optimizer])
    with pytest.raises(TypeError, match="act_fn="):
        apply_gated_linear_units(model, torch.relu)  # the activation in Composer's optimizer slot
    relu = apply_gated_linear_units(model, None, torch.nn.ReLU())
    assert isinstance(relu.bert.encoder.layer[0].output.act, torch.nn.ReLU)


def test_gated_block_defaults_have_no_input_biases():
    from functrain.functional.gated_linear_units_hf import BERTGatedFFOutput

    glu = BERTGatedFFOutput(d_embed=8, d_ff=16, dropout_rate=0.0, act_fn=F.gelu, layernorm_eps=1e-5)
    assert glu.gated_layer.bias is None and glu.non_gated_layer.bias is None
    assert glu.wo.bias is not None and glu.layernorm.eps == 1e-5


def test_replaced_blocks_are_counted_and_only_complete_bert_blocks_replaced():
    from functrain.functional.gated_linear_units_hf import apply_hf_gated_linear_units

    model = bert()
    assert apply_hf_gated_linear_units(model, None, False, False) == 2  # two BERT layers
    assert apply_hf_gated_linear_units(gpt2(), None, False, False) == 2  # two GPT-2 blocks
    assert apply_hf_gated_linear_units(torch.nn.Linear(2, 2), None, False, False) == 0
    # A BertIntermediate without its BertOutput is not a feed-forward block: left alone.
    half = torch.nn.Module()
    half.intermediate = transformers.models.bert.modeling_bert.BertIntermediate(bert().config)
    half.output = torch.nn.Identity()
    assert apply_hf_gated_linear_units(half, None, False, False) == 0
    assert type(half.intermediate).__name__ == "BertIntermediate"


def test_without_transformers_imported_only_functrain_mlps_are_replaced(monkeypatch):
    import sys

    from functrain.functional.gated_linear_units_hf import apply_hf_gated_linear_units
    from functrain.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8))
    monkeypatch.delitem(sys.modules, "transformers")  # as in a process that never imported it
    assert apply_hf_gated_linear_units(model, None, False, False) == 0
    new = apply_gated_linear_units(model)  # one functrain MLP, nothing from transformers
    assert type(new.blocks[0].mlp).__name__ == "GLUMLP"


def test_gpt2_gate_activation_is_kept_as_a_module():
    mlp = apply_gated_linear_units(gpt2()).transformer.h[0].mlp
    assert type(mlp.act).__name__ == "NewGELUActivation"  # GPT-2's own, unwrapped
    relu = apply_gated_linear_units(gpt2(), act_fn=torch.nn.ReLU()).transformer.h[0].mlp
    assert type(relu.act) is torch.nn.ReLU
    wrapped = apply_gated_linear_units(gpt2(), act_fn=torch.tanh).transformer.h[0].mlp
    assert isinstance(wrapped.act, torch.nn.Module)  # a function becomes a module
    x = torch.randn(2, 32)
    hidden = torch.tanh(x @ wrapped.gate.weight.T) * (x @ wrapped.value.weight.T)
    torch.testing.assert_close(wrapped(x), hidden @ wrapped.proj.weight.T + wrapped.proj.bias)
