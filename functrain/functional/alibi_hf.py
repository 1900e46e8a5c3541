"""ALiBi for Hugging Face transformers' GPT-2 and BERT (what `apply_alibi` does to such a model).

Recent transformers compute attention through a dispatch table (`ALL_ATTENTION_FUNCTIONS`, "eager",
"sdpa", ...), so a patch of an old private method (`GPT2Attention._attn`, Composer's way) is never
called. Here the attention modules become subclasses of their own class whose `forward` keeps the
module's projections, cache and dropout but computes the attention itself, with the linear biases
added to the scores (`alibi_attention`), whatever attention implementation the config names.

- GPT-2 (`GPT2Attention`, causal): head `h` adds `-m_h * (i - j)` to query `i`'s score on key `j`
  (`j <= i`), positions counted from the cache's start when generating.
- BERT (`BertSelfAttention`, bidirectional unless the config is a decoder): `-m_h * |i - j|`.
- Position embeddings are zeroed and frozen, and extended to `max_sequence_length` (so weights
  keep Composer's names and shapes: `wpe.weight`, `embeddings.position_embeddings.weight`); each
  attention module gets a `(n_head,)` `alibi_slopes` buffer (Composer stores a precomputed `alibi`
  bias buffer instead).

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16))
    >>> new = apply_hf_alibi(model, max_sequence_length=64)
    >>> type(new.transformer.h[0].attn).__name__
    'ALiBiGPT2Attention'
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn

from .module_surgery import reclass


def alibi_scores_bias(
    slopes: torch.Tensor, query_positions: torch.Tensor, key_length: int, causal: bool
) -> torch.Tensor:
    """The `(n_head, queries, keys)` ALiBi bias: `-m_h * (i - j)` (causal) or `-m_h * |i - j|`.

    Future keys of a causal bias are `-inf`.
    """
    keys = torch.arange(key_length, device=slopes.device)
    distance = (query_positions.to(slopes.device)[:, None] - keys[None, :]).to(slopes.dtype)
    if not causal:
        return -slopes[:, None, None] * distance.abs()
    bias = -slopes[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf"))


def _additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """transformers' attention mask (boolean: True keeps; or additive floats) as additive floats."""
    if mask is None:
        return None
    if mask.dim() == 2:  # (batch, keys) of 1/0
        mask = mask[:, None, None, :].bool()
    if mask.dtype == torch.bool:
        zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return zeros.masked_fill(~mask, float("-inf"))
    return mask.to(dtype)


def alibi_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    slopes: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Scaled dot-product attention with ALiBi biases.

    Args:
        query: `(batch, heads, queries, head_dim)`; the queries are the last of the keys.
        key, value: `(batch, heads, keys, head_dim)`.
        attention_mask: transformers' mask (None, boolean or additive), broadcast over heads.
        slopes: `(heads,)` ALiBi slopes.
        causal: mask future keys and use the one-sided distance.
        scale: the factor of `q @ k^T` (transformers' `scaling`).
        dropout_p: dropout on the attention weights.
    Returns:
        the attended values, `(batch, queries, heads, head_dim)` (transformers' layout).
    """
    queries, keys = query.shape[-2], key.shape[-2]
    positions = torch.arange(keys - queries, keys, device=query.device)
    bias = alibi_scores_bias(slopes.float(), positions, keys, causal)
    mask = _additive_mask(attention_mask, torch.float32)
    if mask is not None:
        bias = bias + mask
    # A row with every key masked (a padded query) would give NaN; the lowest finite value gives
    # it uniform weights instead, as transformers' own masks do.
    bias = bias.clamp_min(torch.finfo(torch.float32).min).to(query.dtype)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=dropout_p, scale=scale
    )
    return out.transpose(1, 2)


def _self_cache(cache):
    return getattr(cache, "self_attention_cache", cache)


class _ALiBiGPT2Attention:
    """GPT-2 self-attention with ALiBi (mixed into a subclass of the module's own class)."""

    def forward(
        self,
        hidden_states,
        cache=None,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        output_attentions=False,
        past_key_values=None,
        **kwargs,
    ):
        if encoder_hidden_states is not None:
            raise NotImplementedError("ALiBi is for self-attention; this call is cross-attention")
        cache = cache if cache is not None else past_key_values
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        query, key, value = (t.view(shape).transpose(1, 2) for t in (query, key, value))
        if cache is not None:
            key, value = _self_cache(cache).update(key, value, self.layer_idx)
        dropout = self.attn_dropout.p if self.training else 0.0
        out = alibi_attention(
            query, key, value, attention_mask, self.alibi_slopes, causal=True,
            scale=self.scaling, dropout_p=dropout,
        )  # fmt: skip
        out = self.resid_dropout(self.c_proj(out.reshape(*out.shape[:-2], -1)))
        return out, None


class _ALiBiBertSelfAttention:
    """BERT self-attention with ALiBi (mixed into a subclass of the module's own class)."""

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        encoder_hidden_states=None,
        past_key_values=None,
        **kwargs,
    ):
        if encoder_hidden_states is not None:
            raise NotImplementedError("ALiBi is for self-attention; this call is cross-attention")
        cache = cache if cache is not None else past_key_values
        shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
        query, key, value = (
            layer(hidden_states).view(shape).transpose(1, 2)
            for layer in (self.query, self.key, self.value)
        )
        if cache is not None:
            key, value = _self_cache(cache).update(key, value, self.layer_idx)
        dropout = self.dropout.p if self.training else 0.0
        out = alibi_attention(
            query, key, value, attention_mask, self.alibi_slopes,
            causal=bool(getattr(self, "is_causal", False)), scale=self.scaling, dropout_p=dropout,
        )  # fmt: skip
        return out.reshape(*out.shape[:-2], -1).contiguous(), None


@functools.cache
def _alibi_class(cls: type, mixin: type) -> type:
    """`ALiBi<cls>`: `cls` with `mixin`'s forward (one class per pair, so types compare equal)."""
    return type(f"ALiBi{cls.__name__}", (mixin, cls), {"__module__": __name__})


def _transformers_classes() -> dict[str, type] | None:
    """The transformers classes the surgery knows, or None when transformers is not imported."""
    if "transformers" not in sys.modules:  # a model of theirs implies the package is imported
        return None
    from transformers.models.bert.modeling_bert import BertEmbeddings, BertSelfAttention
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model

    return {
        "GPT2Attention": GPT2Attention,
        "GPT2Model": GPT2Model,
        "BertSelfAttention": BertSelfAttention,
        "BertEmbeddings": BertEmbeddings,
    }


def is_hf_model(model: nn.Module) -> bool:
    """Whether `model` holds a GPT-2 or BERT attention of transformers (what this module handles)."""
    classes = _transformers_classes()
    if classes is None:
        return False
    kinds = (classes["GPT2Attention"], classes["BertSelfAttention"])
    return any(isinstance(m, kinds) for m in model.modules())


def _zero_frozen_positions(embedding: nn.Embedding, length: int) -> None:
    weight = embedding.weight
    embedding.weight = nn.Parameter(
        torch.zeros(length, weight.shape[1], dtype=weight.dtype, device=weight.device),
        requires_grad=False,
    )
    embedding.num_embeddings = length


def apply_hf_alibi(model: nn.Module, max_sequence_length: int) -> nn.Module:
    """ALiBi in every GPT-2 / BERT self-attention of a transformers model (in place on `model`,
    which `apply_alibi` has already copied).

    Args:
        model: a transformers model (`GPT2LMHeadModel`, `BertForMaskedLM`, ...).
        max_sequence_length: the longest sequence the new model accepts.
    Returns:
        the model.
    Raises:
        ValueError: when it has no such attention, or a cross-attention one.
    """
    classes = _transformers_classes()
    if classes is None:
        raise ValueError("apply_hf_alibi needs a transformers model")
    count = 0
    for module in list(model.modules()):
        if isinstance(module, classes["GPT2Attention"]):
            if module.is_cross_attention:
                raise ValueError("ALiBi cannot be applied to GPT-2 cross-attention")
            mixin, heads = _ALiBiGPT2Attention, module.num_heads
        elif isinstance(module, classes["BertSelfAttention"]):
            mixin, heads = _ALiBiBertSelfAttention, module.num_attention_heads
        else:
            continue
        from .alibi import alibi_slopes  # here: alibi imports this module

        device = next(module.parameters()).device
        module.register_buffer("alibi_slopes", alibi_slopes(int(heads)).to(device))
        reclass(module, _alibi_class(type(module), mixin))
        count += 1
    if count == 0:
        raise ValueError(
            "apply_alibi supports transformers' GPT2Attention and BertSelfAttention (GPT-2, BERT, "
            "and models built from them); this model has neither"
        )
    for module in model.modules():
        if isinstance(module, classes["GPT2Model"]):
            _zero_frozen_positions(module.wpe, max_sequence_length)
        elif isinstance(module, classes["BertEmbeddings"]):
            _zero_frozen_positions(module.position_embeddings, max_sequence_length)
            ids = torch.arange(max_sequence_length, device=module.position_ids.device)[None]
            module.register_buffer("position_ids", ids, persistent=False)
            types = torch.zeros_like(ids)
            module.register_buffer("token_type_ids", types, persistent=False)
    config = getattr(model, "config", None)
    if config is not None:
        for name in ("n_positions", "max_position_embeddings"):
            if hasattr(config, name):
                setattr(config, name, int(max_sequence_length))
    return model
