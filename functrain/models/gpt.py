"""A small GPT (nanoGPT-style) for tests, examples and benchmarks.

Token and learned position embeddings, `n_layer` pre-LayerNorm blocks of causal self-attention and
an MLP, a final LayerNorm and an lm head tied to the token embedding.

The attention module is written so that position schemes can hook in without editing it:
`Attention.alibi_slopes` is a buffer slot (None by default). When it holds one slope per head
(`functrain.functional.apply_alibi` puts it there), each head adds `-slope * (i - j)` to the score
of query `i` on key `j`, and the model drops its position embedding. Any attention module that
exposes `n_head` and an `alibi_slopes` buffer slot in this way can be ALiBi'd by the same surgery.

Example:
    >>> model = GPT(GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32))
    >>> logits = model(torch.zeros(4, 16, dtype=torch.long))
    >>> logits.shape
    torch.Size([4, 16, 65])
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Shape of a `GPT`.

    Attributes:
        vocab_size: number of token ids.
        block_size: the longest sequence the position embedding covers.
        n_layer: number of transformer blocks.
        n_head: attention heads per block (must divide `n_embd`).
        n_embd: width of the residual stream.
        dropout: dropout on embeddings, attention weights and residual branches.
        bias: whether Linear and LayerNorm layers have biases.
        mlp_ratio: hidden width of the MLP as a multiple of `n_embd`.
    """

    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True
    mlp_ratio: int = 4

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}); "
                "change one of them"
            )
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")


def alibi_bias(slopes: torch.Tensor, length: int) -> torch.Tensor:
    """The additive ALiBi score bias `(n_head, length, length)`: `-slope * (i - j)` for `j <= i`.

    Entries above the diagonal (future keys) are `-inf`, so the result is also the causal mask.
    """
    pos = torch.arange(length, device=slopes.device)
    distance = (pos[:, None] - pos[None, :]).to(slopes.dtype)  # i - j
    bias = -slopes[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf"))


class Attention(nn.Module):
    """Causal multi-head self-attention.

    Args:
        config: the model's `GPTConfig`.
    Attributes:
        n_head: number of heads.
        alibi_slopes: None, or a `(n_head,)` buffer of ALiBi slopes (see the module docstring).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.register_buffer("alibi_slopes", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        slopes = self.alibi_slopes
        if not isinstance(slopes, torch.Tensor):  # the slot holds None: no ALiBi
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            bias = alibi_bias(slopes.float(), length).to(q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
        y = y.transpose(1, 2).reshape(batch, length, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    """`proj(act(fc(x)))` with dropout; the GLU surgery replaces it (see `apply_gated_linear_units`)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only transformer language model.

    Args:
        config: its `GPTConfig`.
    Attributes:
        max_sequence_length: the longest input accepted (the position embedding's size, or what
            ALiBi surgery set).
    Example:
        >>> model = GPT(GPTConfig(vocab_size=10, block_size=8, n_embd=16, n_head=2))
        >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 10])
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.max_sequence_length = config.block_size
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe: nn.Embedding | None = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one parameter under the name "wte.weight"
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the stream's variance flat.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits `(batch, length, vocab_size)` for token ids `idx` of shape `(batch, length)`."""
        if idx.dim() != 2:
            raise ValueError(
                f"GPT expects token ids of shape (batch, length), got {tuple(idx.shape)}"
            )
        length = idx.shape[1]
        if length > self.max_sequence_length:
            raise ValueError(
                f"sequence of length {length} is longer than the model's maximum "
                f"{self.max_sequence_length}; crop the input or build the model with a larger "
                "block_size (or apply ALiBi with a larger max_sequence_length)"
            )
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(length, device=idx.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_loss(model: nn.Module, batch) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy for a `(inputs, targets)` batch of token ids (a step `loss_fn`).

    Args:
        model: a `GPT` (or any module mapping `(B, T)` ids to `(B, T, V)` logits).
        batch: `(inputs, targets)`, both `(B, T)` long tensors, or a dict with "input_ids" and
            "labels".
    Returns:
        `(loss, {"outputs": logits})`.
    """
    if isinstance(batch, dict):
        inputs, targets = batch["input_ids"], batch["labels"]
    else:
        inputs, targets = batch
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss, {"outputs": logits}
