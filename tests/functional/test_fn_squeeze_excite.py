"""Squeeze-excite: only wide convs get gates, and gates in (0, 1) only shrink channels."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.squeeze_excite import (
    SqueezeExcite2d,
    SqueezeExciteConv2d,
    apply_squeeze_excite,
    resolve_latent,
)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), channels=st.integers(2, 16))
def test_gates_scale_each_channel_by_a_factor_in_0_1(seed, channels):
    torch.manual_seed(seed)
    se = SqueezeExcite2d(channels, latent_channels=0.5)
    x = torch.randn(2, channels, 5, 5)
    ratio = se(x) / x
    assert bool(((ratio > 0) & (ratio < 1)).all())
    # one factor per (sample, channel)
    torch.testing.assert_close(ratio, ratio[..., :1, :1].expand_as(ratio))


def test_apply_squeeze_excite_targets_wide_convs():
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.Conv2d(32, 32, 3), nn.Conv2d(32, 8, 3))
    new = apply_squeeze_excite(model, latent_channels=4, min_channels=16)
    assert [type(m).__name__ for m in new] == ["Conv2d", "SqueezeExciteConv2d", "Conv2d"]
    assert torch.equal(new[1].conv.weight, model[1].weight)
    assert new[1].se.latent_channels == 4
    assert isinstance(new[1], SqueezeExciteConv2d)


def test_latent_resolution():
    assert (
        resolve_latent(0.25, 64) == 16
        and resolve_latent(64, 8) == 64
        and resolve_latent(0.01, 8) == 1
    )
    with pytest.raises(ValueError, match="positive"):
        resolve_latent(0, 8)
