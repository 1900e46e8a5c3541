"""Weight standardization: outputs invariant to positive per-filter affine changes of weights."""

import pytest
import torch
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
