"""Weight standardization: outputs invariant to positive per-filter affine changes of weights."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.weight_standardization import (
    StandardizedConv2d,
    apply_weight_standardization,
    standardize_weight,
)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_invariant_to_per_filter_scale_and_shift(seed):
    torch.manual_seed(seed)
    conv = apply_weight_standardization(nn.Conv2d(3, 4, 3, padding=1))
    x = torch.randn(2, 3, 5, 5)
    out = conv(x)
    with torch.no_grad():
        conv.weight.mul_(torch.rand(4, 1, 1, 1) * 3 + 0.1).add_(torch.randn(4, 1, 1, 1))
    torch.testing.assert_close(conv(x), out, rtol=1e-4, atol=1e-4)
    w = standardize_weight(conv.weight)
    torch.testing.assert_close(w.mean((1, 2, 3)), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(w.var((1, 2, 3), unbiased=False), torch.ones(4), atol=1e-4, rtol=0)


def test_last_layers_can_be_left_plain():
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.Conv1d(2, 2, 1), nn.Conv2d(2, 2, 1))
    new = apply_weight_standardization(model, n_last_layers_ignore=1)
    assert [type(m).__name__ for m in new] == ["StandardizedConv2d", "StandardizedConv1d", "Conv2d"]
    assert list(new.state_dict()) == list(model.state_dict())
    assert isinstance(new[0], StandardizedConv2d)
    with pytest.raises(ValueError, match="n_last_layers_ignore"):
        apply_weight_standardization(model, -1)


# -- values by hand, every conv dimension, the eps guard, the ignore budget -----------------------


def _hand_standardized(weight: torch.Tensor) -> torch.Tensor:
    """Per output filter: subtract the mean, divide by the (biased) standard deviation."""
    flat = weight.detach().reshape(weight.shape[0], -1)
    mean = flat.sum(1, keepdim=True) / flat.shape[1]
    std = ((flat - mean).square().sum(1, keepdim=True) / flat.shape[1]).sqrt()
    return ((flat - mean) / std).reshape(weight.shape)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_each_conv_dimension_convolves_with_the_standardized_weight(dims):
    torch.manual_seed(dims)
    conv_cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    functional = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
    conv = conv_cls(3, 4, 3, padding=1)
    new = apply_weight_standardization(conv)
    assert type(new).__name__ == f"StandardizedConv{dims}d"
    x = torch.randn(2, 3, *([5] * dims))
    expected = functional(x, _hand_standardized(conv.weight), conv.bias, padding=1)
    torch.testing.assert_close(new(x), expected, rtol=1e-5, atol=1e-5)


def test_a_constant_filter_becomes_zero_not_nan():
    weight = torch.cat([torch.full((1, 2, 3, 3), 0.5), torch.randn(1, 2, 3, 3)])
    out = standardize_weight(weight)
    assert torch.equal(out[0], torch.zeros(2, 3, 3))  # eps keeps 0 / 0 away
    torch.testing.assert_close(out[1], _hand_standardized(weight)[1], rtol=1e-5, atol=1e-6)


def test_ignoring_more_layers_than_there_are_leaves_all_plain():
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.Conv2d(2, 2, 1))
    assert [type(m) for m in apply_weight_standardization(model, 5)] == [nn.Conv2d, nn.Conv2d]
    assert [type(m) for m in apply_weight_standardization(model, 2)] == [nn.Conv2d, nn.Conv2d]
    everything = apply_weight_standardization(model)  # the default ignores none
    assert [type(m) for m in everything] == [StandardizedConv2d, StandardizedConv2d]
    assert [type(m) for m in model] == [nn.Conv2d, nn.Conv2d]  # on a copy
