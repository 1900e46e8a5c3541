"""Fused LayerNorm: a warning no-op without CUDA and Apex."""

import pytest
import torch
from torch import nn

from functrain.functional.fused_layernorm import apply_fused_layernorm, fused_layernorm_available


def test_unavailable_means_an_unchanged_copy_and_a_warning():
    if fused_layernorm_available():
        pytest.skip("Apex is installed: the fused path is exercised instead")
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    with pytest.warns(UserWarning, match="not available"):
        new = apply_fused_layernorm(model)
    assert new is not model and type(new[1]) is nn.LayerNorm
    x = torch.randn(2, 3)
    assert torch.equal(new(x), model(x))
