"""GyroDropout: identity in eval, one fixed mask per batch group, masks a function of buffers."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.gyro_dropout import GyroDropout, apply_gyro_dropout, gyro_masks


@settings(max_examples=20, deadline=None)
@given(
    p=st.floats(0.1, 0.9),
    tau=st.integers(1, 4),
    per_group=st.integers(1, 3),
    seed=st.integers(0, 99),
)
def test_groups_share_masks_and_values_are_rescaled(p, tau, per_group, seed):
    layer = GyroDropout(p=p, sigma=8, tau=tau)
    layer.mask_seed.fill_(seed)
    x = torch.rand(tau * per_group, 10) + 0.5
    out = layer(x)
    kept = out != 0
    torch.testing.assert_close(out[kept], (x / (1 - p))[kept])
    groups = kept.reshape(tau, per_group, 10)
    assert bool((groups == groups[:, :1]).all())  # one mask per group
    pool = gyro_masks(seed, 8, 10, p).bool()
    assert torch.equal(groups[:, 0], pool[layer.mask_index])
    assert torch.equal(layer(x), out)  # deterministic given its buffers
    layer.eval()
    assert torch.equal(layer(x), x)


def test_surgery_and_errors():
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.2))
    new = apply_gyro_dropout(model, p=0.2, sigma=4, tau=2)
    assert isinstance(new[1], GyroDropout) and type(model[1]) is nn.Dropout
    assert sorted(dict(new.named_buffers())) == ["1.mask_index", "1.mask_seed"]
    with pytest.raises(ValueError, match="multiple"):
        new[1](torch.ones(3, 4))
    with pytest.raises(ValueError, match="no nn.Dropout"):
        apply_gyro_dropout(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="tau"):
        GyroDropout(sigma=2, tau=4)


def test_surgery_defaults_are_composers_and_the_masks_are_drawn_from_the_seed():
    # Composer's defaults: p = 0.5, a pool of sigma = 256 masks, tau = 16 of them per step.
    new = apply_gyro_dropout(nn.Sequential(nn.Linear(3, 6), nn.Dropout(0.1)))
    layer = new[1]
    assert (layer.p, layer.sigma, layer.tau) == (0.5, 256, 16)
    assert layer.extra_repr() == "p=0.5, sigma=256, tau=16"
    # Built masks: seed 0, masks 0..15, one per group of 32 / 16 = 2 rows, kept values doubled.
    keep = torch.rand(256, 6, generator=torch.Generator().manual_seed(0)) > 0.5
    expected = keep[:16].float().repeat_interleave(2, dim=0) * 2.0
    assert torch.equal(layer(torch.ones(32, 6)), expected)


@pytest.mark.parametrize("p", [-0.1, -1.0, 1.0, 1.5])
def test_drop_probability_outside_zero_one_is_rejected(p):
    with pytest.raises(ValueError, match="p must be in \\[0, 1\\)"):
        GyroDropout(p=p, sigma=4, tau=2)


def test_smallest_valid_settings():
    x = torch.rand(3, 5) + 0.5
    assert torch.equal(GyroDropout(p=0.0, sigma=4, tau=1)(x), x)  # p = 0 keeps everything
    single = GyroDropout(p=0.5, sigma=1, tau=1)  # one mask for the whole batch
    kept = single(x) != 0
    assert bool((kept == kept[:1]).all())
    for sigma, tau in ((0, 1), (1, 0), (2, 3)):
        with pytest.raises(ValueError, match="sigma > 0 and 0 < tau <= sigma"):
            GyroDropout(sigma=sigma, tau=tau)


def test_feature_maps_share_one_mask_entry_per_channel():
    # (batch, channels, h, w): the mask is over dimension 1 and broadcast over the rest.
    layer = GyroDropout(p=0.5, sigma=4, tau=2)  # seed 0, masks 0 and 1, two rows each
    keep = (torch.rand(4, 3, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    rows = keep[[0, 0, 1, 1]]
    expected = (rows * 2.0)[:, :, None, None].expand(4, 3, 2, 5)
    assert torch.equal(layer(torch.ones(4, 3, 2, 5)), expected)


def test_zero_drop_probability_is_the_identity_for_any_batch():
    x = torch.rand(3, 5)  # 3 rows: not a multiple of tau = 2, fine when nothing is dropped
    assert GyroDropout(p=0.0, sigma=4, tau=2)(x) is x
