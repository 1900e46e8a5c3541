"""GLU surgery: every MLP becomes proj(act(gate x) * value x), value/proj copied from fc/proj."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.gated_linear_units import GLUMLP, apply_gated_linear_units, glu_from_mlp
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


class _MLP(nn.Module):
    """A minimal `fc`/`act`/`proj` MLP (no dropout attribute)."""

    def __init__(self, bias: bool = True, act: nn.Module | None = None):
        super().__init__()
        self.fc = nn.Linear(3, 5, bias=bias)
        self.act = act if act is not None else nn.Tanh()
        self.proj = nn.Linear(5, 2)


def test_glumlp_defaults_and_forward_by_hand():
    glu = GLUMLP(3, 5, 2, nn.Tanh())  # defaults: no gate or value bias, a projection bias
    assert glu.gate.bias is None and glu.value.bias is None and glu.proj.bias is not None
    assert isinstance(glu.dropout, nn.Identity)
    x = torch.randn(4, 3)
    hidden = torch.tanh(x @ glu.gate.weight.T) * (x @ glu.value.weight.T)
    torch.testing.assert_close(glu(x), hidden @ glu.proj.weight.T + glu.proj.bias)
    drop = nn.Dropout(0.5)
    assert GLUMLP(3, 5, 2, nn.Tanh(), dropout=drop).dropout is drop


def test_surgery_defaults_copy_fc_and_proj_and_add_no_biases():
    torch.manual_seed(0)
    model = nn.Sequential(_MLP())
    glu = apply_gated_linear_units(model)[0]
    assert glu.gate.bias is None and glu.value.bias is None
    assert torch.equal(glu.value.weight, model[0].fc.weight)
    assert torch.equal(glu.proj.bias, model[0].proj.bias)
    direct = glu_from_mlp(model[0])
    assert direct.gate.bias is None and direct.value.bias is None


def test_value_bias_is_copied_from_fc_when_asked():
    torch.manual_seed(0)
    mlp = _MLP()
    glu = glu_from_mlp(mlp, non_gated_layer_bias=True, gated_layer_bias=True)
    assert torch.equal(glu.value.bias, mlp.fc.bias) and glu.gate.bias is not None
    # an fc without a bias: the value bias is kept (fresh), not copied from nothing
    no_bias = glu_from_mlp(_MLP(bias=False), non_gated_layer_bias=True)
    assert no_bias.value.bias is not None and no_bias.value.bias.shape == (5,)


def test_only_complete_mlps_are_replaced():
    half = nn.Module()
    half.fc = nn.Linear(3, 5)  # no proj, no act
    lone_act = nn.Module()
    lone_act.act = nn.GELU()  # only an activation
    functional_act = nn.Module()
    functional_act.fc, functional_act.proj = nn.Linear(3, 5), nn.Linear(5, 2)
    functional_act.act = torch.tanh  # a function, not a module: not an MLP of ours
    for model in (half, lone_act, functional_act):
        with pytest.raises(ValueError, match="no MLP"):
            apply_gated_linear_units(model)


def test_optimizers_argument_errors_say_what_to_do():
    model = nn.Sequential(_MLP())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for optimizers in (sgd, [sgd], (sgd,)):
        with pytest.raises(TypeError, match="changes no optimizer"):
            apply_gated_linear_units(model, optimizers)
    # an activation in the optimizers' place (Composer's second argument)
    with pytest.raises(TypeError, match="pass the activation by name"):
        apply_gated_linear_units(model, torch.tanh)
    with pytest.raises(TypeError, match="changes no optimizer"):
        apply_gated_linear_units(model, torch.tanh, act_fn=torch.relu)
