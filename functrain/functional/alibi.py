"""ALiBi (Press et al., 2022): attention with linear biases instead of position embeddings.

Each head `h` adds `-m_h * (i - j)` to the score of query `i` on key `j`, with geometric slopes
`m_h`; the learned position embedding is removed. Models then train on short sequences and
evaluate on longer ones, so ALiBi also trains on sequences shortened by
`train_sequence_length_scaling` (the batch is reshaped, keeping the tokens per batch).

Attention API: surgery works on any attention module exposing `n_head` (int) and an
`alibi_slopes` buffer slot (None until set) whose forward adds the bias when the slot holds a
`(n_head,)` tensor -- `functrain.models.gpt.Attention` does. A module that has an attribute
`max_sequence_length` gets it raised to the new maximum, and its `wpe` position embedding (if any)
is removed. Hugging Face GPT-2 and BERT models (transformers' `GPT2Attention`,
`BertSelfAttention`) get ALiBi by `functrain.functional.alibi_hf`.

Example:
    >>> from functrain.models import GPT, GPTConfig
    >>> model = apply_alibi(GPT(GPTConfig(block_size=16)), max_sequence_length=64)
    >>> model.wpe is None, model.max_sequence_length
    (True, 64)
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from ..tree import tree_flatten, tree_unflatten
from .alibi_hf import apply_hf_alibi, is_hf_model
from .module_surgery import check_module, reject_optimizers


def alibi_slopes(n_head: int) -> torch.Tensor:
    """The ALiBi slopes for `n_head` heads: `2^(-8/n), 2^(-16/n), ...` (interleaved if not 2^k)."""
    if n_head <= 0:
        raise ValueError(f"n_head must be positive, got {n_head}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        slopes = power_of_two(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def _is_alibi_attention(module: nn.Module) -> bool:
    return hasattr(module, "alibi_slopes") and isinstance(getattr(module, "n_head", None), int)


def apply_alibi(model: nn.Module, max_sequence_length: int, optimizers: Any = None) -> nn.Module:
    """A copy of `model` using ALiBi in every supporting attention module.

    Args:
        model: the model (not modified): one whose attention exposes the ALiBi slot (see the
            module docstring), or a Hugging Face GPT-2 / BERT model (`functional.alibi_hf`).
        max_sequence_length: the longest sequence the new model accepts.
        optimizers: Composer's argument; functrain's surgery touches no optimizer (see
            `module_surgery.reject_optimizers`), so only None is accepted.
    Returns:
        the new model; its position embedding is gone (one parameter fewer), or for a Hugging
        Face model zeroed, frozen and extended to `max_sequence_length`.
    Raises:
        ValueError: when no attention module supports ALiBi.
    """
    check_module(model, "apply_alibi")
    reject_optimizers("apply_alibi", optimizers)
    if max_sequence_length <= 0:
        raise ValueError(f"max_sequence_length must be positive, got {max_sequence_length}")
    new = copy.deepcopy(model)
    if is_hf_model(new):
        return apply_hf_alibi(new, int(max_sequence_length))
    attentions = [m for m in new.modules() if _is_alibi_attention(m)]
    if not attentions:
        raise ValueError(
            "apply_alibi found no attention module with `n_head` and an `alibi_slopes` buffer "
            "slot, nor a Hugging Face attention it supports (transformers' GPT2Attention and "
            "BertSelfAttention); see functrain.functional.alibi's "
            "docstring for the attention API"
        )
    for attention in attentions:
        device = next((p.device for p in attention.parameters()), torch.device("cpu"))
        attention.register_buffer("alibi_slopes", alibi_slopes(attention.n_head).to(device))
    for module in new.modules():
        if hasattr(module, "max_sequence_length"):
            module.max_sequence_length = int(max_sequence_length)
            if isinstance(getattr(module, "wpe", None), nn.Embedding):
                module.wpe = None
    return new


def scale_sequence_length(batch: Any, scaling: float) -> Any:
    """Reshape every `(B, T, ...)` tensor of a batch to `(B / scaling, T * scaling, ...)`.

    Keeps the tokens per batch while training on shorter sequences. Next-token targets stay
    aligned: each row is cut into consecutive chunks.

    Args:
        batch: a tensor, tuple/list or dict whose tensors share `(B, T)` leading dimensions.
        scaling: the fraction of the sequence kept per row, in (0, 1]; `T * scaling` must be an
            integer dividing `T`.
    Returns:
        the reshaped batch (same structure).
    """
    if not 0 < scaling <= 1:
        raise ValueError(f"train_sequence_length_scaling must be in (0, 1], got {scaling}")
    if scaling == 1:
        return batch
    leaves, spec = tree_flatten(batch)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not tensors or tensors[0].dim() < 2:
        raise ValueError("ALiBi's sequence scaling needs a batch of (batch, sequence) tensors")
    rows, length = tensors[0].shape[:2]
    new_length = round(length * scaling)
    if new_length < 1 or length % new_length or abs(length * scaling - new_length) > 1e-6:
        raise ValueError(
            f"sequence length {length} times train_sequence_length_scaling={scaling} must be an "
            f"integer that divides it; choose a scaling such as {1 / 2} or {1 / 4} that fits"
        )
    factor = length // new_length
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.dim() < 2 or tuple(leaf.shape[:2]) != (rows, length):
                raise ValueError(
                    "every tensor of the batch must have the same (batch, sequence) leading "
                    f"dimensions {(rows, length)} to be rescaled; got {tuple(leaf.shape)}"
                )
            leaf = leaf.reshape(rows * factor, new_length, *leaf.shape[2:])
        out.append(leaf)
    return tree_unflatten(spec, out)
