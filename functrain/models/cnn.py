"""A small ResNet-style CNN for 28x28 (MNIST, Fashion-MNIST) and 8x8 (digits) images.

A 3x3 stem, stages of residual blocks with BatchNorm (each stage after the first halves the
resolution with a strided convolution), global average pooling, dropout and a linear classifier.

`ResidualBlock` follows torchvision's `BasicBlock` layout (`conv1`, `bn1`, `relu`, `conv2`, `bn2`,
`downsample`) and also exposes `residual_branch(x)` and `shortcut(x)`, the protocol that
stochastic depth uses to drop the branch.

Example:
    >>> model = SmallResNet(in_channels=1, num_classes=10)
    >>> model(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    """`relu(shortcut(x) + bn2(conv2(relu(bn1(conv1(x))))))`.

    Args:
        in_channels: channels of the input.
        out_channels: channels of the output.
        stride: stride of `conv1` (and of the 1x1 shortcut when the shape changes).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """The branch that stochastic depth may drop."""
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """The identity path (a 1x1 projection when the shape changes)."""
        return x if self.downsample is None else self.downsample(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.shortcut(x) + self.residual_branch(x))


class SmallResNet(nn.Module):
    """A compact residual network for small grey or colour images.

    Args:
        in_channels: image channels (1 for MNIST and digits).
        num_classes: number of output logits.
        widths: channels of each stage; every stage after the first downsamples by 2.
        blocks_per_stage: residual blocks per stage.
        dropout: dropout before the classifier (0 keeps an identity `nn.Dropout` in place, which
            GyroDropout can replace).
        stem_pool: add a 2x2 max-pool after the stem (for 28x28 inputs; BlurPool can replace it).
    Example:
        >>> SmallResNet(in_channels=1, widths=(8, 16))(torch.zeros(3, 1, 8, 8)).shape
        torch.Size([3, 10])
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        widths: Sequence[int] = (16, 32),
        blocks_per_stage: int = 1,
        dropout: float = 0.0,
        stem_pool: bool = False,
    ):
        super().__init__()
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) <= 0 or blocks_per_stage <= 0:
            raise ValueError(
                f"widths must be positive channel counts and blocks_per_stage >= 1; got "
                f"widths={widths}, blocks_per_stage={blocks_per_stage}"
            )
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        self.pool = nn.MaxPool2d(2) if stem_pool else nn.Identity()
        stages = []
        channels = widths[0]
        for index, width in enumerate(widths):
            blocks = []
            for b in range(blocks_per_stage):
                stride = 2 if index > 0 and b == 0 else 1
                blocks.append(ResidualBlock(channels, width, stride))
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits `(batch, num_classes)` for images `(batch, in_channels, H, W)`."""
        if x.dim() != 4:
            raise ValueError(f"SmallResNet expects images (batch, C, H, W), got {tuple(x.shape)}")
        x = self.stages(self.pool(self.stem(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(self.dropout(x))


def classification_loss(model: nn.Module, batch) -> tuple[torch.Tensor, dict]:
    """Cross-entropy for an `(images, labels)` batch (a step `loss_fn`).

    Labels may be class indices or dense probability targets (as mixing algorithms produce).

    Returns:
        `(loss, {"outputs": logits, "accuracy": fraction correct})`.
    """
    images, labels = batch
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    hard = labels if labels.dim() == 1 else labels.argmax(dim=1)
    accuracy = (logits.argmax(dim=1) == hard).float().mean()
    return loss, {"outputs": logits, "accuracy": accuracy}
