"""Small reference models for tests, examples and benchmarks.

- `GPT` / `GPTConfig`: a nanoGPT-style character/token language model with an ALiBi-ready
  `Attention` and a `MLP` that the GLU surgery can replace; `gpt_loss` is its step loss.
- `SmallResNet`: a residual CNN with BatchNorm for 28x28 and 8x8 images; `classification_loss`
  is its step loss.
"""

from .cnn import ResidualBlock, SmallResNet, classification_loss
from .gpt import GPT, MLP, Attention, Block, GPTConfig, alibi_bias, gpt_loss

__all__ = [
    "GPT",
    "MLP",
    "Attention",
    "Block",
    "GPTConfig",
    "ResidualBlock",
    "SmallResNet",
    "alibi_bias",
    "classification_loss",
    "gpt_loss",
]
