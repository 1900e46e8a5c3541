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


# -- rates in between, the basic-block layout, defaults, bad arguments --------------------------


def test_block_mode_drops_the_branch_at_its_rate():
    block = _block(2)
    wrapped = StochasticBlock(block, 0.25, "block").train()
    x = torch.rand(1, 4, 3, 3)  # nonnegative, so relu(x) == x: a dropped branch returns x
    torch.manual_seed(3)
    outs = [wrapped(x) for _ in range(400)]
    dropped = sum(torch.equal(out, x) for out in outs)
    full = block.relu(x + block.residual_branch(x))
    assert all(torch.equal(out, x) or torch.allclose(out, full) for out in outs)
    assert 60 <= dropped <= 140  # 100 expected (0.25 of 400); binomial sd ~8.7, seeded


def test_sample_mode_drops_samples_at_its_rate():
    torch.manual_seed(4)
    x = torch.rand(2000, 1) + 1
    kept = (sample_drop(x, torch.tensor(0.3), training=True) != 0).float().mean()
    assert 0.65 <= float(kept) <= 0.75  # 0.7 expected; sd ~0.01


def test_a_basic_block_layout_with_a_projection_in_eval():
    class BasicBlock(nn.Module):  # torchvision's attribute layout: no conv3, a downsample
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4)
            self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.relu = nn.ReLU()
            self.downsample = nn.Conv2d(2, 4, 1, stride=2)

    torch.manual_seed(5)
    block = BasicBlock().eval()
    wrapped = StochasticBlock(block, 0.4).eval()
    x = torch.randn(2, 2, 6, 6)
    branch = block.bn2(block.conv2(block.relu(block.bn1(block.conv1(x)))))
    expected = torch.relu(block.downsample(x) + 0.6 * branch)
    torch.testing.assert_close(wrapped(x), expected)
    wrapped.drop_rate.fill_(1.0)  # the algorithm's warm-up writes this buffer
    torch.testing.assert_close(wrapped.train()(x), torch.relu(block.downsample(x)))


def test_apply_defaults_block_mode_and_linear_rates_up_to_0_2():
    model = nn.Sequential(_block(0), _block(1))
    new = apply_stochastic_depth(model, ResidualBlock)
    assert [m.method for m in new] == ["block", "block"]
    assert [float(m.target_drop_rate) for m in new] == pytest.approx([0.1, 0.2])
    assert [float(m.drop_rate) for m in new] == pytest.approx([0.1, 0.2])
    assert StochasticBlock(_block(0), 0.1).method == "block"


def test_targets_by_name_tuple_and_list():
    class Other(ResidualBlock):
        pass

    model = nn.Sequential(_block(0), Other(4, 4))
    for target in (("ResidualBlock", "Other"), [ResidualBlock], "Other"):
        new = apply_stochastic_depth(model, target, drop_distribution="uniform")
        wrapped = [type(m.block).__name__ for m in new if isinstance(m, StochasticBlock)]
        assert wrapped == (["Other"] if target == "Other" else ["ResidualBlock", "Other"])


def test_rate_bounds_and_methods_are_checked():
    model = nn.Sequential(_block(0))
    for rate in (0.0, 1.0):
        assert float(apply_stochastic_depth(model, ResidualBlock, drop_rate=rate)[0].drop_rate) == (
            rate
        )
    for rate in (-0.1, 1.1):
        with pytest.raises(ValueError, match=r"drop_rate must be in \[0, 1\]"):
            apply_stochastic_depth(model, ResidualBlock, drop_rate=rate)
    with pytest.raises(ValueError, match="stochastic_method"):
        apply_stochastic_depth(model, ResidualBlock, stochastic_method="row")
    with pytest.raises(ValueError, match="stochastic_method"):
        StochasticBlock(_block(0), 0.1, "row")
    with pytest.raises(ValueError, match=r"no 'Missing' block.*\(residual blocks here: "):
        apply_stochastic_depth(model, "Missing")
    with pytest.raises(ValueError, match=r"no 'Missing' block in the model; pass") as info:
        apply_stochastic_depth(nn.Sequential(nn.Linear(2, 2)), "Missing")
    assert "residual blocks here" not in str(info.value)  # none to list


class _BranchOnly(nn.Module):  # half of the protocol: no shortcut
    def residual_branch(self, x):
        return x


class _Protocol(_BranchOnly):  # the whole protocol, no torchvision attributes
    def shortcut(self, x):
        return x


class _TorchvisionLayout(nn.Module):  # torchvision's attributes, no protocol methods
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)
        self.conv2, self.bn2 = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)
        self.relu, self.downsample = nn.ReLU(), None


def test_half_a_protocol_is_refused_and_either_kind_of_block_is_listed():
    with pytest.raises(TypeError, match=r"residual_branch\(x\) and shortcut\(x\)"):
        StochasticBlock(_BranchOnly(), 0.1)
    assert isinstance(StochasticBlock(_Protocol(), 0.1).block, _Protocol)
    model = nn.Sequential(_Protocol(), _TorchvisionLayout(), _BranchOnly())
    with pytest.raises(
        ValueError, match=r"residual blocks here: \['_Protocol', '_TorchvisionLayout'\]"
    ):
        apply_stochastic_depth(model, "Missing")
