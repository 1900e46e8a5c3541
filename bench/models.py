"""The benchmark models of `python -m bench overhead` (and `update`, `memory`): specs and batches.

Example:
    >>> spec = model_specs()["mlp"]
    >>> model, batches = spec.build(), Batches(spec, torch.device("cpu"))
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelSpec:
    """A benchmark model: how to build it, its batches, its loss, and how long a block runs.

    Attributes:
        name: the key in tables and JSON.
        description: one line for the table.
        build: `() -> nn.Module`, deterministic (the same weights on every call).
        make_batch: `(generator) -> (inputs, targets)`.
        criterion: `(outputs, targets) -> loss`; every variant trains on this same loss.
        steps: timed steps per block (0.1-0.3 s of one core's time: short blocks interleave the
            variants finely, so a change in the machine's load hits them alike).
    """

    name: str
    description: str
    build: Callable[[], torch.nn.Module]
    make_batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    steps: int

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        """`criterion(model(inputs), targets)`: the loss_fn of every variant."""
        inputs, targets = batch
        return self.criterion(model(inputs), targets)


def _mlp(sizes: Sequence[int]) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _seeded(build: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def seeded():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return build()

    return seeded


def _images(batch: int, size: int) -> Callable:
    return lambda g: (
        torch.randn(batch, 1, size, size, generator=g),
        torch.randint(0, 10, (batch,), generator=g),
    )


def _tokens(batch: int, length: int, vocab: int) -> Callable:
    def make(g):
        ids = torch.randint(0, vocab, (batch, length + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    return make


def _sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def model_specs() -> dict[str, ModelSpec]:
    """The four benchmark models, by name."""
    from functrain.models import GPT, GPTConfig, SmallResNet

    gpt = GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=256)
    specs = [
        ModelSpec(
            "tiny_mlp",
            "MLP 64-128-128-10, batch 32",
            _seeded(lambda: _mlp([64, 128, 128, 10])),
            lambda g: (torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)),
            F.cross_entropy,
            steps=150,
        ),
        ModelSpec(
            "mlp",
            "MLP 784-1024-1024-10, batch 256",
            _seeded(lambda: _mlp([784, 1024, 1024, 10])),
            lambda g: (
                torch.randn(256, 784, generator=g),
                torch.randint(0, 10, (256,), generator=g),
            ),
            F.cross_entropy,
            steps=6,
        ),
        ModelSpec(
            "cnn",
            "ResNet-style CNN (16-32 ch, BatchNorm), 28x28, batch 64",
            _seeded(lambda: SmallResNet(in_channels=1, num_classes=10, widths=(16, 32))),
            _images(64, 28),
            F.cross_entropy,
            steps=4,
        ),
        ModelSpec(
            "gpt",
            "GPT 4 layers, d=256, 4 heads, context 64, batch 16",
            _seeded(lambda: GPT(gpt)),
            _tokens(16, 64, gpt.vocab_size),
            _sequence_loss,
            steps=3,
        ),
    ]
    return {spec.name: spec for spec in specs}


class Batches:
    """`length` batches that cycle through `count` fixed ones: a long epoch, cheap to index.

    A long epoch keeps epoch-end work (which every trainer does differently) out of the timings.
    """

    def __init__(self, spec: ModelSpec, device: torch.device, count: int = 8, length: int = 10**7):
        gen = torch.Generator().manual_seed(1234)
        self.batches = [tuple(t.to(device) for t in spec.make_batch(gen)) for _ in range(count)]
        self.length = length
        self.batch_size = len(self.batches[0][0])  # Composer reads it (one microbatch per batch)

    def take(self, length: int) -> Batches:
        """The same batches as an epoch of `length`."""
        view = copy.copy(self)
        view.length = length
        return view

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.batches[index % len(self.batches)]

    def __iter__(self):
        return (self.batches[i % len(self.batches)] for i in range(self.length))
