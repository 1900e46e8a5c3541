"""Composer's data-aware factorization solvers: the fit to the outputs is the optimum (checked
against an independent alternating least squares run to convergence), exact for low-rank
operators, better than the weight's own SVD on anisotropic inputs, and convolutions rebuilt from
the factors compute what the original did."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional import factorize_conv2d, factorize_matrix, low_rank_factors


def _als_error(x, y, k, rounds=400, seed=0):
    """The residual of rank-k fit by plain alternating least squares with a bias column (an
    independent route to the same optimum)."""
    g = torch.Generator().manual_seed(seed)
    ones = torch.ones(x.shape[0], 1, dtype=x.dtype)
    a = torch.randn(x.shape[1], k, generator=g, dtype=x.dtype)
    for _ in range(rounds):
        z = torch.cat([x @ a, ones], 1)
        bb = torch.linalg.lstsq(z, y).solution  # [k + 1, M]: Wb and the bias
        b, bias = bb[:k], bb[k:]
        target = y - bias  # solve x a b = target for a: vec trick through lstsq on kron
        a = (
            torch.linalg.lstsq(torch.kron(b.T.contiguous(), x), target.T.reshape(-1, 1))
            .solution.reshape(k, x.shape[1])
            .T
        )
    z = torch.cat([x @ a, ones], 1)
    fit = z @ torch.linalg.lstsq(z, y).solution
    return float((y - fit).square().sum())


@settings(max_examples=10, deadline=None)
@given(d=st.integers(3, 6), m=st.integers(3, 6), seed=st.integers(0, 100))
def test_the_fit_is_the_optimum(d, m, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, d, generator=g, dtype=torch.float64) * torch.linspace(0.2, 3, d).double()
    w = torch.randn(d, m, generator=g, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(40, m, generator=g, dtype=torch.float64) + 2.0
    k = min(d, m) - 1
    solution = factorize_matrix(x, y, w, rank=k)
    ours = float((y - (x @ solution.Wa @ solution.Wb + solution.bias)).square().sum())
    assert solution.rank == k and solution.Wa.shape == (d, k) and solution.Wb.shape == (k, m)
    assert ours <= _als_error(x, y, k) * (1 + 1e-6) + 1e-9
    expected_nmse = (y - (x @ solution.Wa @ solution.Wb + solution.bias)).square().mean() / y.var()
    assert solution.nmse == pytest.approx(float(expected_nmse), rel=1e-9)


def test_a_low_rank_operator_is_recovered_exactly_with_its_bias():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 12, generator=g, dtype=torch.float64) + 3.0  # inputs off centre
    y = x @ torch.randn(12, 3, generator=g).double() @ torch.randn(3, 9, generator=g).double()
    bias = torch.arange(9.0, dtype=torch.float64)
    solution = factorize_matrix(x, y + bias, torch.randn(12, 9, dtype=torch.float64), rank=3)
    assert solution.nmse < 1e-20
    torch.testing.assert_close(x @ solution.Wa @ solution.Wb + solution.bias, y + bias)


def test_fitting_the_data_beats_the_weights_own_svd_on_anisotropic_inputs():
    g = torch.Generator().manual_seed(1)
    scales = torch.tensor([10.0, 5.0, 1.0, 0.1, 0.1, 0.1, 0.1, 0.1])
    x = torch.randn(500, 8, generator=g) * scales
    w = torch.randn(8, 8, generator=g)
    solution = factorize_matrix(x, x @ w, w, rank=2)
    left, right = low_rank_factors(w.T, 2)  # the weight's SVD: (out, r) and (r, in)
    svd_error = (x @ w - x @ (left @ right).T).square().mean()
    data_error = (x @ w - (x @ solution.Wa @ solution.Wb + solution.bias)).square().mean()
    assert data_error < 0.5 * svd_error


def test_no_factorization_where_it_cannot_help_and_progressive_calls():
    x, w = torch.randn(30, 4), torch.randn(4, 6)
    whole = factorize_matrix(x, x @ w + 1.0, w, bias=torch.ones(6), rank=4)
    assert whole.rank == -1 and whole.Wb is None
    torch.testing.assert_close(whole.Wa, w, atol=1e-4, rtol=1e-4)  # least squares recovers w
    wa, wb = torch.randn(4, 2), torch.randn(2, 6)
    kept = factorize_matrix(x, x @ wa @ wb, wa, wb, rank=3)  # more than the current 2
    assert kept.rank == -1 and torch.equal(kept.Wa, wa) and torch.equal(kept.Wb, wb)
    assert factorize_matrix(torch.randn(30, 8), torch.randn(30, 8), torch.randn(8, 8)).rank == 2
    with pytest.raises(ValueError, match="rank must be"):
        factorize_matrix(x, x @ w, w, rank=0)
    with pytest.raises(ValueError, match="same N"):
        factorize_matrix(x, torch.randn(3, 6), w)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_low_rank_convolution_is_rebuilt_from_its_two_factors(stride):
    g = torch.Generator().manual_seed(2)
    c_in, c_out, k = 4, 6, 3
    a0 = torch.randn(2, c_in, k, k, generator=g, dtype=torch.float64)
    b0 = torch.randn(c_out, 2, 1, 1, generator=g, dtype=torch.float64)
    weight = (b0.flatten(1) @ a0.flatten(1)).reshape(c_out, c_in, k, k)  # rank 2
    bias = torch.randn(c_out, generator=g, dtype=torch.float64)
    x = torch.randn(3, c_in, 9, 9, generator=g, dtype=torch.float64)
    solution = factorize_conv2d(x, weight, rank=2, biasA=bias, padding=1, stride=stride)
    assert solution.Wa.shape == (2, c_in, k, k) and solution.Wb.shape == (c_out, 2, 1, 1)
    rebuilt = F.conv2d(F.conv2d(x, solution.Wa, padding=1, stride=stride), solution.Wb,
                       solution.bias)  # fmt: skip
    torch.testing.assert_close(rebuilt, F.conv2d(x, weight, bias, padding=1, stride=stride))
    assert solution.nmse < 1e-20


def test_conv_arguments_it_cannot_honour_are_refused():
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    with pytest.raises(ValueError, match="biasB"):
        factorize_conv2d(x, w, biasB=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="dilation"):
        factorize_conv2d(x, w, dilation=2)
