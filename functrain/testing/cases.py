"""`Case`: one small, rebuildable training setup (model, state, batches) for the law checkers.

A case is a plain record of a few integers, so hypothesis can draw and shrink it and a failure
prints it in one line (`Case(mlp 4->8->3, batch 2, seed 0)`). Everything else is rebuilt from it
on demand, always the same way: the model's initial weights and the batches are pure functions
of the case (torch's global generator is saved and restored around the model's construction).

Example:
    >>> case = Case(kind="cnn", batch_size=4)
    >>> model = case.model()
    >>> state = case.state(model, functrain.optim.sgd(lr=0.1))
    >>> x, y = case.batch(0)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..rng import seeded_global_rng
from ..state import TrainState, init

KINDS = ("mlp", "cnn")


class TinyMLP(nn.Sequential):
    """`Linear -> Tanh -> Linear` on `(N, features)` inputs, `classes` logits.

    `input_shape` (one sample's) and `classes` say what batches it takes.
    """

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, classes))
        self.input_shape, self.classes = (features,), classes


class TinyCNN(nn.Module):
    """`Conv -> BatchNorm -> ReLU -> mean pool -> Linear` on `(N, C, H, W)` images (has buffers).

    `input_shape` (one sample's, for `size` x `size` images) and `classes` say what batches it
    takes; any image size works.
    """

    def __init__(self, channels: int, hidden: int, classes: int, size: int = 4):
        super().__init__()
        self.input_shape, self.classes = (channels, size, size), classes
        self.conv = nn.Conv2d(channels, hidden, 3, padding=1)
        self.bn = nn.BatchNorm2d(hidden)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def cross_entropy_loss(model: Any, batch: Any) -> torch.Tensor:
    """The cases' loss: cross-entropy of `model(x)` against `y` (class indices or probabilities).

    Example:
        >>> step = functrain.make_step(model, cross_entropy_loss, opt)
    """
    x, y = batch
    return F.cross_entropy(model(x), y)


class Case(NamedTuple):
    """A small classification setup, rebuilt identically from these fields.

    Attributes:
        kind: "mlp" (inputs `(N, features)`) or "cnn" (inputs `(N, channels, size, size)`,
            a BatchNorm with running statistics).
        features: input features of the MLP, or channels of the CNN's images.
        size: image height and width (CNN only).
        hidden: hidden width.
        classes: number of classes (targets are class indices).
        batch_size: samples per batch (at least 2, for BatchNorm).
        seed: the initial weights', the batches' and the state's seed.
    """

    kind: str = "mlp"
    features: int = 4
    size: int = 4
    hidden: int = 8
    classes: int = 3
    batch_size: int = 4
    seed: int = 0

    def __repr__(self) -> str:
        shape = (
            f"{self.features}" if self.kind == "mlp" else f"{self.features}x{self.size}x{self.size}"
        )
        return f"Case({self.kind} {shape}->{self.hidden}->{self.classes}, batch {self.batch_size}, seed {self.seed})"

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input sample."""
        if self.kind == "mlp":
            return (self.features,)
        return (self.features, self.size, self.size)

    def model(self) -> nn.Module:
        """A fresh module, its weights a pure function of the case."""
        if self.kind not in KINDS:
            raise ValueError(f"Case.kind must be one of {KINDS}, got {self.kind!r}")
        if self.batch_size < 2:
            raise ValueError(f"Case.batch_size must be >= 2 (BatchNorm), got {self.batch_size}")
        with seeded_global_rng(self.seed):
            if self.kind == "mlp":
                return TinyMLP(self.features, self.hidden, self.classes)
            return TinyCNN(self.features, self.hidden, self.classes, self.size)

    def state(self, model: nn.Module, optimizer: Any, horizon: int = 8) -> TrainState:
        """`functrain.init(model, optimizer, seed=case.seed)` with the run's horizon set.

        Args:
            model: this case's model (from `case.model()`).
            optimizer: a `functrain.optim.Transform`.
            horizon: `max_batches` (and `batches_per_epoch`), for algorithms that read the
                fraction of training done.
        Returns:
            the initial `TrainState`.
        """
        state = init(model, optimizer, seed=self.seed)
        ts = state.timestamp.replace(max_batches=horizon, batches_per_epoch=horizon)
        return state.replace(timestamp=ts)

    def batch(self, index: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `index`: `(inputs, class indices)`, a pure function of the case and `index`."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.batch_size, *self.input_shape, generator=gen)
        y = torch.randint(0, self.classes, (self.batch_size,), generator=gen)
        return x, y

    def batches(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first `n` batches."""
        return [self.batch(i) for i in range(n)]

    def dataset(self, n_batches: int) -> torch.utils.data.TensorDataset:
        """`n_batches` batches as one map-style dataset (for `fit` with a `Loader`)."""
        xs, ys = zip(*self.batches(n_batches))
        return torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))

    def grads(self, params: dict[str, torch.Tensor], index: int = 0) -> dict[str, torch.Tensor]:
        """Random gradients shaped like `params`, a pure function of the case and `index`."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 500_000 + index)
        return {
            k: torch.randn(v.shape, generator=gen, dtype=v.dtype).to(v.device)
            for k, v in params.items()
        }


__all__ = ["KINDS", "Case", "TinyCNN", "TinyMLP", "cross_entropy_loss"]
