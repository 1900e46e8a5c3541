"""Gated linear units for Hugging Face transformers' BERT and GPT-2 feed-forward blocks.

- BERT: as Composer does, each layer's `intermediate` (`BertIntermediate`) becomes an identity and
  its `output` (`BertOutput`) a `BERTGatedFFOutput` with Composer's names (`gated_layer`,
  `non_gated_layer`, `wo`, `dropout`, `act`, `layernorm`), so a Composer-saved GLU BERT loads with
  `strict=True`: `layernorm(wo(dropout(act(gated_layer(x)) * non_gated_layer(x))) + residual)`.
- GPT-2: each `GPT2MLP` (`c_fc`, `act`, `c_proj`, `dropout`) becomes functrain's `GLUMLP`
  (`gate`, `value`, `proj`); Composer has no GPT-2 policy.

As for functrain's own MLPs, the value layer starts from the original first layer's weights, the
output projection (and BERT's LayerNorm) are copied, and the gate is freshly initialised (Composer
initialises every new layer afresh).

Example:
    >>> from transformers import BertConfig, BertForMaskedLM
    >>> model = BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2,
    ...                                    num_attention_heads=2, intermediate_size=64))
    >>> new = apply_gated_linear_units(model)     # functrain.functional's entry point
    >>> type(new.bert.encoder.layer[0].output).__name__
    'BERTGatedFFOutput'
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn

from .gated_linear_units import GLUMLP


class BERTGatedFFOutput(nn.Module):
    """BERT's feed-forward block with a gated linear unit (Composer's layout and names).

    Args:
        d_embed: width of the residual stream.
        d_ff: width of the gated hidden layer.
        dropout_rate: dropout after the gating.
        act_fn: the gate's activation (a module or a function).
        layernorm_eps: the LayerNorm's epsilon.
        gated_layer_bias, non_gated_layer_bias: biases of the two input projections.
    """

    def __init__(
        self,
        d_embed: int,
        d_ff: int,
        dropout_rate: float,
        act_fn: Callable[[torch.Tensor], torch.Tensor],
        layernorm_eps: float,
        gated_layer_bias: bool = False,
        non_gated_layer_bias: bool = False,
    ):
        super().__init__()
        self.gated_layer = nn.Linear(d_embed, d_ff, bias=gated_layer_bias)
        self.non_gated_layer = nn.Linear(d_embed, d_ff, bias=non_gated_layer_bias)
        self.wo = nn.Linear(d_ff, d_embed)
        self.dropout = nn.Dropout(dropout_rate)
        self.act = act_fn
        self.layernorm = nn.LayerNorm(d_embed, eps=layernorm_eps)

    def forward(self, hidden_states: torch.Tensor, residual_connection: torch.Tensor):
        gated = self.act(self.gated_layer(hidden_states)) * self.non_gated_layer(hidden_states)
        return self.layernorm(self.wo(self.dropout(gated)) + residual_connection)


def _classes() -> dict[str, type] | None:
    if "transformers" not in sys.modules:  # a model of theirs implies the package is imported
        return None
    from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    return {"BertIntermediate": BertIntermediate, "BertOutput": BertOutput, "GPT2MLP": GPT2MLP}


def _bert_glu(intermediate, output, act_fn, gated_layer_bias, non_gated_layer_bias):
    dense_in, dense_out = intermediate.dense, output.dense
    glu = BERTGatedFFOutput(
        d_embed=dense_out.out_features,
        d_ff=dense_out.in_features,
        dropout_rate=output.dropout.p,
        act_fn=act_fn if act_fn is not None else intermediate.intermediate_act_fn,
        layernorm_eps=output.LayerNorm.eps,
        gated_layer_bias=gated_layer_bias,
        non_gated_layer_bias=non_gated_layer_bias,
    ).to(device=dense_in.weight.device, dtype=dense_in.weight.dtype)
    with torch.no_grad():
        glu.non_gated_layer.weight.copy_(dense_in.weight)
        if non_gated_layer_bias:
            glu.non_gated_layer.bias.copy_(dense_in.bias)
        glu.wo.load_state_dict(dense_out.state_dict())
        glu.layernorm.load_state_dict(output.LayerNorm.state_dict())
    return glu


def _gpt2_glu(mlp, act_fn, gated_layer_bias, non_gated_layer_bias):
    # transformers' Conv1D keeps its weight as (in, out): the transpose of nn.Linear's.
    fc, proj = mlp.c_fc, mlp.c_proj
    embed, hidden = fc.weight.shape
    act = act_fn if act_fn is not None else mlp.act
    glu = GLUMLP(
        embed,
        hidden,
        proj.weight.shape[1],
        act if isinstance(act, nn.Module) else _Function(act),
        gated_layer_bias=gated_layer_bias,
        non_gated_layer_bias=non_gated_layer_bias,
        proj_bias=True,
        dropout=mlp.dropout,
    ).to(device=fc.weight.device, dtype=fc.weight.dtype)
    with torch.no_grad():
        glu.value.weight.copy_(fc.weight.T)
        if non_gated_layer_bias:
            glu.value.bias.copy_(fc.bias)
        glu.proj.weight.copy_(proj.weight.T)
        glu.proj.bias.copy_(proj.bias)
    return glu


class _Function(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def apply_hf_gated_linear_units(
    model: nn.Module,
    act_fn: Callable[[torch.Tensor], torch.Tensor] | None,
    gated_layer_bias: bool,
    non_gated_layer_bias: bool,
) -> int:
    """Replace BERT's and GPT-2's feed-forward blocks of `model` in place (a surgery copy).

    Returns:
        how many blocks were replaced (0 for a model without them).
    """
    classes = _classes()
    if classes is None:
        return 0
    count = 0
    for module in list(model.modules()):
        intermediate = getattr(module, "intermediate", None)
        output = getattr(module, "output", None)
        if isinstance(intermediate, classes["BertIntermediate"]) and isinstance(
            output, classes["BertOutput"]
        ):
            module.output = _bert_glu(
                intermediate, output, act_fn, gated_layer_bias, non_gated_layer_bias
            )
            module.intermediate = nn.Identity()
            count += 1
        mlp = getattr(module, "mlp", None)
        if isinstance(mlp, classes["GPT2MLP"]):
            module.mlp = _gpt2_glu(mlp, act_fn, gated_layer_bias, non_gated_layer_bias)
            count += 1
    return count
