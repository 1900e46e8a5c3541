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


# -- values by hand, defaults, boundaries --------------------------------------------------------


def test_gates_are_the_sigmoid_of_the_mlp_of_the_channel_means():
    torch.manual_seed(0)
    se = SqueezeExcite2d(6, latent_channels=3)
    x = torch.randn(2, 6, 4, 5)
    down, up = se.pool_and_mlp[2].weight, se.pool_and_mlp[4].weight  # (3, 6), (6, 3)
    means = x.sum(dim=(2, 3)) / 20
    gates = 1 / (1 + torch.exp(-(torch.clamp(means @ down.T, min=0) @ up.T)))
    torch.testing.assert_close(se(x), x * gates[:, :, None, None])


def test_default_latent_sizes():
    assert SqueezeExcite2d(64).latent_channels == 8  # 0.125 of the channels
    assert SqueezeExciteConv2d(nn.Conv2d(4, 16, 1)).se.latent_channels == 2  # of the conv's output
    # apply_squeeze_excite: 64 latent channels, only convs with >= 128 channels on both sides
    model = nn.Sequential(nn.Conv2d(128, 128, 1), nn.Conv2d(128, 127, 1), nn.Conv2d(127, 128, 1))
    new = apply_squeeze_excite(model)
    assert [type(m).__name__ for m in new] == ["SqueezeExciteConv2d", "Conv2d", "Conv2d"]
    assert new[0].se.latent_channels == 64


def test_exactly_min_channels_is_wide_enough():
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.Conv2d(8, 7, 1))
    new = apply_squeeze_excite(model, latent_channels=2, min_channels=8)
    assert [type(m).__name__ for m in new] == ["SqueezeExciteConv2d", "Conv2d"]


def test_the_gates_follow_the_convs_dtype():
    conv = nn.Conv2d(4, 4, 1).double()
    block = SqueezeExciteConv2d(conv, latent_channels=2)
    assert all(p.dtype == torch.float64 for p in block.se.parameters())
    assert block(torch.randn(1, 4, 3, 3, dtype=torch.float64)).dtype == torch.float64


def test_latent_resolution_at_the_edges():
    assert resolve_latent(1, 8) == 1  # 1 is a count, not the whole
    assert resolve_latent(0.5, 7) == 3 and resolve_latent(2.7, 8) == 2  # truncated
    with pytest.raises(ValueError, match="positive"):
        resolve_latent(-0.5, 8)
