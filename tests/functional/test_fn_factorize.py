"""Factorization: exact at full rank, the SVD optimum below it, applied only where it pays."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.factorize import (
    FactorizedConv2d,
    FactorizedLinear,
    apply_factorization,
    factorize_conv2d_module,
    factorize_linear,
    factorizing_could_speedup,
    low_rank_factors,
)
from functrain.models import GPT, GPTConfig


@settings(max_examples=25, deadline=None)
@given(i=st.integers(1, 12), o=st.integers(1, 12), bias=st.booleans(), seed=st.integers(0, 1000))
def test_full_rank_linear_keeps_the_function(i, o, bias, seed):
    torch.manual_seed(seed)
    layer = nn.Linear(i, o, bias=bias)
    fact = factorize_linear(layer, min(i, o))
    x = torch.randn(5, i)
    torch.testing.assert_close(fact(x), layer(x), rtol=1e-4, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(
    c_in=st.integers(1, 4),
    c_out=st.integers(1, 6),
    k=st.sampled_from([1, 3]),
    stride=st.integers(1, 2),
    seed=st.integers(0, 1000),
)
def test_full_rank_conv_keeps_the_function(c_in, c_out, k, stride, seed):
    torch.manual_seed(seed)
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2)
    fact = factorize_conv2d_module(conv, min(c_out, c_in * k * k))
    x = torch.randn(2, c_in, 7, 7)
    torch.testing.assert_close(fact(x), conv(x), rtol=1e-4, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(rank=st.integers(1, 6), seed=st.integers(0, 1000))
def test_truncation_error_is_the_svd_tail(rank, seed):
    torch.manual_seed(seed)
    w = torch.randn(6, 9, dtype=torch.float64)
    left, right = low_rank_factors(w, rank)
    s = torch.linalg.svdvals(w)
    error = torch.linalg.matrix_norm(w - left @ right)
    torch.testing.assert_close(error, s[rank:].square().sum().sqrt(), rtol=1e-6, atol=1e-9)


def test_apply_factorization_only_where_it_pays_and_skips_tied_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8), nn.Conv2d(32, 32, 3))
    new = apply_factorization(
        model, min_channels=32, latent_channels=8, min_features=32, latent_features=16
    )
    assert isinstance(new[0], FactorizedLinear) and new[0].latent_features == 16
    assert type(new[1]) is nn.Linear  # too narrow
    assert isinstance(new[2], FactorizedConv2d) and new[2].latent_channels == 8
    assert not factorizing_could_speedup(nn.Linear(64, 64), 32)
    gpt = GPT(GPTConfig(vocab_size=64, n_embd=64, n_head=2, block_size=8, n_layer=1))
    fact_gpt = apply_factorization(gpt, min_features=32, latent_features=8)
    assert type(fact_gpt.lm_head) is nn.Linear and fact_gpt.lm_head.weight is fact_gpt.wte.weight


def test_rank_errors():
    with pytest.raises(ValueError, match="rank"):
        factorize_linear(nn.Linear(3, 2), 3)
    with pytest.raises(ValueError, match="groups"):
        factorize_conv2d_module(nn.Conv2d(4, 4, 3, groups=2), 2)


def test_factorized_children_have_composers_names():
    from functrain.functional import factorize_conv2d_module, factorize_linear

    conv = factorize_conv2d_module(torch.nn.Conv2d(8, 8, 3), 4)
    linear = factorize_linear(torch.nn.Linear(8, 8), 4)
    # composer/algorithms/factorize/factorize_modules.py: module0 (to the latent), module1.
    assert set(conv.state_dict()) == {"module0.weight", "module1.weight", "module1.bias"}
    assert set(linear.state_dict()) == {"module0.weight", "module1.weight", "module1.bias"}


# -- the speed-up rule at its boundaries, Composer's defaults, values against numpy's SVD ---------


def test_the_speedup_rule_at_its_boundaries():
    # Linear: r (in + out) < in out
    assert factorizing_could_speedup(nn.Linear(4, 4), 1)  # 8 < 16
    assert not factorizing_could_speedup(nn.Linear(4, 4), 2)  # 16 == 16
    assert not factorizing_could_speedup(nn.Linear(2, 6), 2)  # 16 > 12
    # Conv2d: r (in kh kw + out) < in out kh kw, with a non-square kernel
    assert factorizing_could_speedup(nn.Conv2d(2, 4, (1, 3)), 2)  # 2 (6 + 4) = 20 < 24
    assert factorizing_could_speedup(nn.Conv2d(2, 4, (3, 1)), 2)  # the same, transposed
    assert not factorizing_could_speedup(nn.Conv2d(2, 2, 1), 1)  # 4 == 4
    assert not factorizing_could_speedup(nn.ReLU(), 1)


def test_composers_defaults():
    # linears: min(in, out) >= 256, rank 128; convs: min(in, out) >= 256, rank 0.25 of it
    model = nn.Sequential(
        nn.Linear(256, 512), nn.Linear(255, 512), nn.Conv2d(256, 256, 1), nn.Conv2d(256, 255, 1)
    )
    new = apply_factorization(model)
    assert [type(m).__name__ for m in new] == [
        "FactorizedLinear", "Linear", "FactorizedConv2d", "Conv2d"
    ]  # fmt: skip
    assert new[0].latent_features == 128 and new[2].latent_channels == 64


def test_switches_fractions_and_grouped_convs():
    model = nn.Sequential(nn.Linear(64, 128), nn.Conv2d(32, 32, 3), nn.Conv2d(32, 32, 3, groups=2))
    kwargs = dict(min_channels=32, latent_channels=0.25, min_features=64, latent_features=0.25)
    new = apply_factorization(model, **kwargs)
    assert [type(m).__name__ for m in new] == ["FactorizedLinear", "FactorizedConv2d", "Conv2d"]
    assert new[0].latent_features == 16 and new[1].latent_channels == 8
    only_convs = apply_factorization(model, factorize_linears=False, **kwargs)
    assert [type(m).__name__ for m in only_convs] == ["Linear", "FactorizedConv2d", "Conv2d"]
    only_linears = apply_factorization(model, factorize_convs=False, **kwargs)
    assert [type(m).__name__ for m in only_linears] == ["FactorizedLinear", "Conv2d", "Conv2d"]
    # a rank above min(in, out) is capped there: 2 (18 + 8) < 2 * 8 * 9 still pays
    capped = apply_factorization(nn.Conv2d(2, 8, 3), min_channels=2, latent_channels=4)
    assert isinstance(capped, FactorizedConv2d) and capped.latent_channels == 2


def test_low_rank_layers_compute_the_truncated_svd():
    import numpy as np

    torch.manual_seed(0)
    layer = nn.Linear(6, 5)
    u, s, vh = np.linalg.svd(layer.weight.detach().double().numpy(), full_matrices=False)
    truncated = torch.from_numpy((u[:, :2] * s[:2]) @ vh[:2]).float()
    x = torch.randn(3, 6)
    fact = factorize_linear(layer, 2)
    assert fact.module0.weight.dtype == torch.float32 and fact.latent_features == 2
    torch.testing.assert_close(fact(x), x @ truncated.T + layer.bias, rtol=1e-5, atol=1e-5)
    conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
    u, s, vh = np.linalg.svd(conv.weight.detach().double().reshape(3, -1).numpy(), False)
    kernel = torch.from_numpy((u[:, :1] * s[:1]) @ vh[:1]).float().reshape(3, 2, 3, 3)
    img = torch.randn(1, 2, 5, 5)
    out = factorize_conv2d_module(conv, 1)(img)
    torch.testing.assert_close(out, F.conv2d(img, kernel, padding=1), rtol=1e-5, atol=1e-5)


def test_rank_bounds_and_dtype():
    for rank in (0, 4):
        with pytest.raises(ValueError, match=r"rank must be in \[1, 3\]"):
            low_rank_factors(torch.randn(3, 5), rank)
    left, right = low_rank_factors(torch.randn(3, 5, dtype=torch.float64), 3)
    assert left.shape == (3, 3) and right.shape == (3, 5) and left.dtype == torch.float64
    double = factorize_linear(nn.Linear(4, 4).double(), 2)
    assert all(p.dtype == torch.float64 for p in double.parameters())
    no_bias = factorize_linear(nn.Linear(4, 4, bias=False), 2)
    assert no_bias.module1.bias is None
    assert FactorizedLinear(4, 3, 2).module1.bias.shape == (3,)  # a bias by default, as Linear
