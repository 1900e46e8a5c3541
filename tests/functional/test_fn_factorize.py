"""Factorization: exact at full rank, the SVD optimum below it, applied only where it pays."""

import pytest
import torch
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
