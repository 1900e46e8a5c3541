"""Composer's data-aware factorization solvers: the fit to the outputs is the optimum (checked
against an independent alternating least squares run to convergence), exact for low-rank
operators, better than the weight's own SVD on anisotropic inputs, and convolutions rebuilt from
the factors compute what the original did."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional import (
    LowRankSolution,
    factorize_conv2d,
    factorize_matrix,
    low_rank_factors,
)


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


# -- where factorizing stops, progressive calls, dtypes, padding modes, bad arguments ------------


def test_a_rank_reaching_either_side_leaves_the_operator_whole():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(40, 6, generator=g), torch.randn(6, 4, generator=g)
    whole = factorize_matrix(x, x @ w, w, rank=4)  # k == M < D
    assert whole.rank == -1 and whole.Wb is None and whole.bias is None
    torch.testing.assert_close(whole.Wa, w, atol=1e-4, rtol=1e-4)
    below = factorize_matrix(x, x @ w, w, rank=3)
    assert below.rank == 3 and below.Wa.shape == (6, 3) and below.Wb.shape == (3, 4)
    assert factorize_matrix(x, x @ w, w, rank=2.9).rank == 2  # an int above 1 is truncated
    assert factorize_matrix(x, x @ w, w, rank=0.5).rank == 3  # half of D = 6


def test_progressive_calls_at_and_below_the_current_rank():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(60, 8, generator=g, dtype=torch.float64)
    wa, wb = torch.randn(8, 3, generator=g).double(), torch.randn(3, 7, generator=g).double()
    y = x @ wa @ wb
    same = factorize_matrix(x, y, wa, wb, rank=3)  # k == d: nothing to gain
    assert same.rank == -1 and torch.equal(same.Wa, wa) and torch.equal(same.Wb, wb)
    smaller = factorize_matrix(x, y, wa, wb, rank=2)
    assert smaller.rank == 2 and smaller.Wa.shape == (8, 2) and smaller.Wb.shape == (2, 7)
    # the best rank-2 fit of a rank-3 map on these inputs: no worse than the truncated SVD
    u, s, vh = torch.linalg.svd(wa @ wb)
    svd_fit = x @ ((u[:, :2] * s[:2]) @ vh[:2])
    ours = x @ smaller.Wa @ smaller.Wb + smaller.bias
    assert (y - ours).square().sum() <= (y - svd_fit).square().sum()
    # a fraction of D is capped at the current rank
    capped = factorize_matrix(x, y, wa, wb, rank=0.99)  # int(0.99 * 8) = 7, capped at 3
    assert capped.rank == -1 and torch.equal(capped.Wa, wa) and torch.equal(capped.Wb, wb)


def test_float32_inputs_give_float32_factors_and_a_float_nmse():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(50, 6, generator=g), torch.randn(6, 6, generator=g)
    solution = factorize_matrix(x, x @ w, w, bias=torch.zeros(6), rank=2)
    assert {solution.Wa.dtype, solution.Wb.dtype, solution.bias.dtype} == {torch.float32}
    assert isinstance(solution.nmse, float) and 0 < solution.nmse < 1


def test_bad_arguments_are_named():
    x, w = torch.randn(10, 4), torch.randn(4, 3)
    for bad in (True, "2", -1, 0.0):
        with pytest.raises(ValueError, match="rank must be a positive int"):
            factorize_matrix(x, x @ w, w, rank=bad)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="n_iters must be a positive int"):
            factorize_matrix(x, x @ w, w, n_iters=bad)
    with pytest.raises(ValueError, match="one row per sample"):
        factorize_matrix(x[None], x @ w, w)
    with pytest.raises(ValueError, match="one row per sample"):
        factorize_matrix(x, (x @ w)[None], w)
    with pytest.raises(ValueError, match=r"Wa \(5, 3\) does not map X's 4 features"):
        factorize_matrix(x, x @ w, torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"Wa \(4, 2\) does not map"):
        factorize_matrix(x, x @ w, torch.randn(4, 2))
    conv_x, conv_w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3, 3)
    with pytest.raises(NotImplementedError, match="groups"):
        factorize_conv2d(conv_x, conv_w, groups=2)
    with pytest.raises(NotImplementedError, match="padding as ints"):
        factorize_conv2d(conv_x, conv_w, padding="same")
    assert factorize_conv2d(conv_x, conv_w, rank=1, dilation=(1, 1), groups=(1, 1)).rank == 1


@pytest.mark.parametrize("padding", [(1, 2), (0, 1)])
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular"])
def test_padding_modes_and_uneven_padding_are_honoured(padding_mode, padding):
    g = torch.Generator().manual_seed(6)
    a0 = torch.randn(2, 3, 3, 3, generator=g, dtype=torch.float64)
    b0 = torch.randn(5, 2, 1, 1, generator=g, dtype=torch.float64)
    conv = torch.nn.Conv2d(3, 5, 3, padding=padding, padding_mode=padding_mode).double()
    with torch.no_grad():
        conv.weight.copy_((b0.flatten(1) @ a0.flatten(1)).reshape(5, 3, 3, 3))  # rank 2
    x = torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64)
    solution = factorize_conv2d(
        x, conv.weight, rank=2, biasA=conv.bias, padding=padding, padding_mode=padding_mode
    )
    first = torch.nn.Conv2d(3, 2, 3, padding=padding, padding_mode=padding_mode, bias=False)
    first = first.double()
    with torch.no_grad():
        first.weight.copy_(solution.Wa)
    rebuilt = F.conv2d(first(x), solution.Wb, solution.bias)
    torch.testing.assert_close(rebuilt, conv(x))


def test_a_progressive_conv_with_both_biases_is_rebuilt():
    g = torch.Generator().manual_seed(7)
    wa = torch.randn(3, 4, 3, 3, generator=g, dtype=torch.float64)
    wb = torch.randn(6, 3, 1, 1, generator=g, dtype=torch.float64)
    wb[:, 2] = wb[:, 0]  # make the product rank 2: two latent channels feed alike
    wa[2] = wa[0] * 0.5
    bias_a, bias_b = torch.randn(3, generator=g).double(), torch.randn(6, generator=g).double()
    x = torch.randn(2, 4, 7, 7, generator=g, dtype=torch.float64)
    original = F.conv2d(F.conv2d(x, wa, bias_a, padding=1), wb, bias_b)
    solution = factorize_conv2d(x, wa, wb, rank=2, biasA=bias_a, biasB=bias_b, padding=1)
    assert solution.rank == 2 and solution.nmse < 1e-20
    rebuilt = F.conv2d(F.conv2d(x, solution.Wa, padding=1), solution.Wb, solution.bias)
    torch.testing.assert_close(rebuilt, original)


@pytest.mark.parametrize("padding_mode", ["reflect", "circular"])
def test_the_fit_sees_the_padding_modes_pixels_even_when_padding_only_one_side(padding_mode):
    # a full-rank weight: the rank-2 fit depends on the patches, so they must carry the padding
    # mode's pixels; the patches by hand: pad with the mode, then every 3x3 window as a row
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(5, 3, 3, 3, generator=g, dtype=torch.float64)
    x = torch.randn(2, 3, 5, 6, generator=g, dtype=torch.float64)
    padded = F.pad(x, (1, 1, 0, 0), mode=padding_mode)  # padding (0, 1): width only
    rows = padded.unfold(2, 3, 1).unfold(3, 3, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 27)
    a = weight.reshape(5, -1).T
    expected = factorize_matrix(rows, rows @ a, a, rank=2)
    ours = factorize_conv2d(x, weight, rank=2, padding=(0, 1), padding_mode=padding_mode)
    product = ours.Wa.reshape(2, -1).T @ ours.Wb.reshape(5, 2).T  # free of the SVD's signs
    torch.testing.assert_close(product, expected.Wa @ expected.Wb)
    torch.testing.assert_close(ours.bias, expected.bias)


def test_without_padding_every_patch_lies_inside_the_image():
    # a full-rank weight, so the fit depends on which patches it sees: the unpadded ones
    g = torch.Generator().manual_seed(9)
    weight = torch.randn(4, 2, 3, 3, generator=g, dtype=torch.float64)
    x = torch.randn(2, 2, 5, 6, generator=g, dtype=torch.float64)
    rows = x.unfold(2, 3, 1).unfold(3, 3, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 18)
    a = weight.reshape(4, -1).T
    expected = factorize_matrix(rows, rows @ a, a, rank=2)
    ours = factorize_conv2d(x, weight, rank=2)  # no conv2d_kwargs: padding 0
    product = ours.Wa.reshape(2, -1).T @ ours.Wb.reshape(4, 2).T
    torch.testing.assert_close(product, expected.Wa @ expected.Wb)
    torch.testing.assert_close(ours.bias, expected.bias)


def test_wide_outputs_are_not_mistaken_for_a_shape_mismatch():
    # sizes above 256 are distinct int objects in CPython: the shape check compares values
    g = torch.Generator().manual_seed(10)
    x, w = torch.randn(12, 3, generator=g), torch.randn(3, 300, generator=g)
    assert factorize_matrix(x, x @ w, w, rank=2).Wb.shape == (2, 300)


def test_more_edges_of_the_rank_and_the_shapes():
    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(30, 4, generator=g), torch.randn(4, 6, generator=g)
    assert factorize_matrix(x, x @ w, w, rank=5).rank == -1  # k > D: nothing to gain either
    assert factorize_matrix(x, x @ w, w, rank=0.01).rank == 1  # a tiny fraction: at least 1
    whole = factorize_matrix(x, x @ w, w, rank=4)
    assert whole.nmse == 0.0 and LowRankSolution().nmse == 0.0  # Composer's record default
    for bad_x, bad_y in ((x[..., None], x @ w), (x, (x @ w)[..., None])):  # same N, 3-D
        with pytest.raises(ValueError, match="one row per sample"):
            factorize_matrix(bad_x, bad_y, w)


def test_factorize_conv2d_defaults_to_a_quarter_of_the_fan_in():
    g = torch.Generator().manual_seed(12)
    x, w = torch.randn(2, 4, 6, 6, generator=g), torch.randn(12, 4, 3, 3, generator=g)
    solution = factorize_conv2d(x, w)  # 0.25 of 4 * 3 * 3 = 9 latent channels
    assert solution.rank == 9 and solution.Wa.shape == (9, 4, 3, 3)


def test_a_progressive_conv_without_a_second_bias_is_rebuilt():
    g = torch.Generator().manual_seed(13)
    wa = torch.randn(3, 2, 3, 3, generator=g, dtype=torch.float64)
    wb = torch.randn(5, 3, 1, 1, generator=g, dtype=torch.float64)
    wa[2] = wa[1] - wa[0]  # rank 2
    x = torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64)
    solution = factorize_conv2d(x, wa, wb, rank=2)
    original = F.conv2d(F.conv2d(x, wa), wb)
    rebuilt = F.conv2d(F.conv2d(x, solution.Wa), solution.Wb, solution.bias)
    torch.testing.assert_close(rebuilt, original)
