"""GLU surgery: every MLP becomes proj(act(gate x) * value x), value/proj copied from fc/proj."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.gated_linear_units import GLUMLP, apply_gated_linear_units
from functrain.models import GPT, GPTConfig


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_glu_with_a_unit_gate_is_the_mlp_without_activation(seed):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=8))
    new = apply_gated_linear_units(model, act_fn=lambda t: torch.ones_like(t))
    mlp, glu = model.blocks[0].mlp, new.blocks[0].mlp
    assert isinstance(glu, GLUMLP)
    assert torch.equal(glu.value.weight, mlp.fc.weight) and torch.equal(
        glu.proj.weight, mlp.proj.weight
    )
    x = torch.randn(3, 8)
    torch.testing.assert_close(glu(x), mlp.proj(x @ mlp.fc.weight.T), rtol=1e-5, atol=1e-6)


def test_default_keeps_the_activation_and_counts_parameters():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=8))
    new = apply_gated_linear_units(model, non_gated_layer_bias=True)
    glu = new.blocks[1].mlp
    assert isinstance(glu.act, nn.GELU) and glu.gate.bias is None and glu.value.bias is not None
    x = torch.randn(2, 5, 8)
    expected = glu.proj(glu.act(glu.gate(x)) * glu.value(x))
    torch.testing.assert_close(glu(x), expected)
    extra = sum(p.numel() for p in new.parameters()) - sum(p.numel() for p in model.parameters())
    assert extra == 2 * 32 * 8  # one gate (32 x 8) per block, no gate bias; fc bias -> value bias
    assert new(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 10)


def test_no_mlp_is_an_error():
    with pytest.raises(ValueError, match="no MLP"):
        apply_gated_linear_units(nn.Linear(2, 2))
