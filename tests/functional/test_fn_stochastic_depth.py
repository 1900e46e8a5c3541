"""Stochastic depth: identity at rate 0, shortcut at rate 1, expected value in eval."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.stochastic_depth import (
    StochasticBlock,
    apply_stochastic_depth,
    layer_drop_rates,
    sample_drop,
)
from functrain.models import ResidualBlock, SmallResNet


def _block(seed, stride=1, c_out=4):
    torch.manual_seed(seed)
    return ResidualBlock(4, c_out, stride)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    method=st.sampled_from(["block", "sample"]),
    train=st.booleans(),
    stride=st.integers(1, 2),
)
def test_zero_rate_keeps_the_function(seed, method, train, stride):
    block = _block(seed, stride, 4 * stride)
    wrapped = StochasticBlock(block, 0.0, method)
    block.train(train)
    wrapped.train(train)
    x = torch.randn(3, 4, 6, 6)
    torch.testing.assert_close(wrapped(x), block(x))


@pytest.mark.parametrize("stride", [1, 2])
def test_rate_one_drops_the_branch(stride):
    block = _block(0, stride, 4 * stride)
    x = torch.randn(3, 4, 6, 6)
    for method in ("block", "sample"):
        wrapped = StochasticBlock(block, 1.0, method).train()
        expected = block.relu(block.shortcut(x)) if stride > 1 else x
        if method == "sample":
            expected = block.relu(block.shortcut(x))
        torch.testing.assert_close(wrapped(x), expected)


def test_eval_scales_the_branch_by_its_keep_probability():
    block = _block(1).eval()
    wrapped = StochasticBlock(block, 0.25, "block").eval()
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(wrapped(x), block.relu(x + 0.75 * block.residual_branch(x)))


@settings(max_examples=20, deadline=None)
@given(rate=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_sample_drop_zeroes_whole_samples(rate, seed):
    torch.manual_seed(seed)
    x = torch.rand(16, 3, 2) + 1
    out = sample_drop(x, torch.tensor(rate), training=True)
    per_sample = out.flatten(1)
    kept = (per_sample != 0).all(1)
    assert bool(((per_sample == 0).all(1) | kept).all())
    torch.testing.assert_close(out[kept], x[kept])
    torch.testing.assert_close(sample_drop(x, torch.tensor(rate), training=False), x * (1 - rate))


def test_torchvision_layout_blocks_are_supported():
    class Bottleneck(nn.Module):  # torchvision's attribute layout, without torchvision
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2)
            self.conv2, self.bn2 = nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2)
            self.conv3, self.bn3 = nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4)
            self.relu, self.downsample = nn.ReLU(), None

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + x)

    model = nn.Sequential(Bottleneck(), Bottleneck()).eval()
    new = apply_stochastic_depth(model, "Bottleneck", drop_rate=0.0).eval()
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(new(x), model(x))


def test_rates_over_depth_and_errors():
    assert layer_drop_rates(4, 0.4, "linear") == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert layer_drop_rates(3, 0.2, "uniform") == [0.2] * 3
    model = apply_stochastic_depth(
        SmallResNet(widths=(4, 8), blocks_per_stage=2), ResidualBlock, drop_rate=0.2
    )
    rates = [float(m.target_drop_rate) for m in model.modules() if isinstance(m, StochasticBlock)]
    assert rates == pytest.approx([0.05, 0.1, 0.15, 0.2])
    with pytest.raises(ValueError, match="drop_distribution"):
        layer_drop_rates(2, 0.1, "cubic")
    with pytest.raises(TypeError, match="residual_branch"):
        StochasticBlock(nn.Linear(2, 2), 0.1)
