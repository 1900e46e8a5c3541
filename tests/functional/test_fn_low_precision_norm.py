"""Low-precision norms: exactly the plain norm in fp32, the autocast dtype under autocast."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.low_precision_norm import (
    LPGroupNorm,
    LPLayerNorm,
    apply_low_precision_groupnorm,
    apply_low_precision_layernorm,
)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.integers(2, 16))
def test_layernorm_is_exact_in_fp32_and_bf16_under_autocast(seed, width):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
    new = apply_low_precision_layernorm(model)
    assert isinstance(new[1], LPLayerNorm) and type(model[1]) is nn.LayerNorm
    assert list(dict(new.named_parameters())) == list(dict(model.named_parameters()))
    x = torch.randn(3, width)
    assert torch.equal(new(x), model(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = new(x)
    assert low.dtype == torch.bfloat16
    # Compare with fp32 LayerNorm of the same bf16 input: normalising few, nearly equal values
    # amplifies the input's rounding, which is autocast's doing, not the norm's.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model[0](x)
    reference = model[1](hidden.float())
    torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.05)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_groupnorm_is_exact_in_fp32(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(2, 8, 1), nn.GroupNorm(4, 8))
    new = apply_low_precision_groupnorm(model)
    assert isinstance(new[1], LPGroupNorm)
    x = torch.randn(2, 2, 4, 4)
    assert torch.equal(new(x), model(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert new(x).dtype == torch.bfloat16


def test_composers_precision_argument():
    from functrain.functional import LPLayerNorm

    model = torch.nn.Sequential(torch.nn.LayerNorm(4))
    assert isinstance(apply_low_precision_layernorm(model, "amp_bf16")[0], LPLayerNorm)
    with pytest.warns(UserWarning, match="no effect"):
        unchanged = apply_low_precision_layernorm(model, "fp32")
    assert type(unchanged[0]) is torch.nn.LayerNorm and unchanged is not model
