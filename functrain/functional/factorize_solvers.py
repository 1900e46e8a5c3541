"""Data-aware factorization under Composer's names: `factorize_matrix`, `factorize_conv2d`.

Where `factorize_linear`/`factorize_conv2d_module` (functrain/functional/factorize.py) split a
layer's weight by its own SVD, these choose the two factors that best reproduce the layer's
*outputs on given inputs*: for inputs `X` `[N, D]` and outputs `Y` `[N, M]`, the `Wa` `[D, r]`,
`Wb` `[r, M]` and bias `b` `[M]` minimising `||Y - (X @ Wa @ Wb + b)||_F`. Composer's signatures
and `LowRankSolution` record; the solution here is the exact optimum in one pass (Composer runs a
few rounds of alternating least squares towards it): with the column means removed, the best
unconstrained map is `W* = lstsq(X, Y)`, and since `||Y - X W||^2 = ||Y - X W*||^2 +
||R (W* - W)||^2` (`X = Q R`), the best rank-`r` `W` is `R^+` times the truncated SVD of `R W*`.

Example:
    >>> x = torch.randn(256, 16)
    >>> y = x @ torch.randn(16, 2) @ torch.randn(2, 12)       # rank 2 outputs
    >>> solution = factorize_matrix(x, y, torch.randn(16, 12), rank=2)
    >>> solution.nmse < 1e-10
    True
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class LowRankSolution:
    """A factorized linear operator (Composer's record).

    Attributes:
        Wa: the first factor, `[D, rank]` (a matrix) or `[rank, C_in, kh, kw]` (a convolution);
            the whole solution `[D, M]` when factorizing would not help (`rank == -1`).
        Wb: the second factor, `[rank, M]` or `[C_out, rank, 1, 1]`; None when `rank == -1`.
        bias: added to the output of the second factor.
        rank: the latent size, or -1 when the operator was left unfactorized.
        nmse: mean squared error of the approximation divided by the variance of the original
            output (0: exact; 1: no better than the mean).
    """

    Wa: torch.Tensor | None = None
    Wb: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    rank: int = -1
    nmse: float = 0.0


def _latent(rank: int | float, inputs: int, current: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, float)) or not rank > 0:
        raise ValueError(f"rank must be a positive int or a fraction in (0, 1), got {rank!r}")
    if rank < 1:  # a fraction of the input size (at most the current latent size)
        return max(1, min(int(rank * inputs), current))
    return int(rank)


def _nmse(y: torch.Tensor, y_hat: torch.Tensor) -> float:
    return float((y - y_hat).square().mean() / y.var())


def factorize_matrix(
    X: torch.Tensor,
    Y: torch.Tensor,
    Wa: torch.Tensor,
    Wb: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    rank: int | float = 0.25,
    n_iters: int = 3,
) -> LowRankSolution:
    """The rank-`rank` `(Wa, Wb, bias)` whose `X @ Wa @ Wb + bias` is closest to `Y`.

    Args:
        X: inputs `[N, D]` (samples as rows).
        Y: the original operator's outputs on them, `[N, M]` (`X @ W + bias`).
        Wa: the operator `[D, M]`, or the first factor `[D, d]` of one already factorized.
        Wb: the second factor `[d, M]` of an already factorized operator (progressive
            factorization), or None.
        bias: the original operator's bias `[M]` (its outputs `Y` include it).
        rank: the latent size: an int, or a fraction of `D` (at most the current `d`).
        n_iters: Composer's number of alternating rounds; the solution here is exact, so any
            positive int gives the same result (accepted so that Composer calls run unchanged).
    Returns:
        a `LowRankSolution`. When `rank >= min(D, M)` factorizing cannot help: `Wa` is the
        least-squares map `[D, M]`, `Wb` None, `rank` -1. When `Wb` is given and `rank >= d`,
        the factors are returned as they are, `rank` -1.
    """
    if isinstance(n_iters, bool) or not isinstance(n_iters, int) or n_iters < 1:
        raise ValueError(f"n_iters must be a positive int, got {n_iters!r}")
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"X must be [N, D] and Y [N, M] with the same N (one row per sample); got "
            f"{tuple(X.shape)} and {tuple(Y.shape)}"
        )
    X, Y, Wa = X.detach(), Y.detach(), Wa.detach()
    if Wa.shape[0] != X.shape[1] or (Wb is None and Wa.shape[1] != Y.shape[1]):
        raise ValueError(
            f"Wa {tuple(Wa.shape)} does not map X's {X.shape[1]} features to Y's {Y.shape[1]}"
        )
    k = _latent(rank, X.shape[1], Wa.shape[1])
    solution = LowRankSolution(bias=None if bias is None else bias.detach().clone())
    if k >= X.shape[1] or k >= Y.shape[1]:
        solution.Wa = torch.linalg.lstsq(X, Y - (0 if bias is None else bias.detach())).solution
        return solution
    if Wb is not None and k >= Wa.shape[1]:
        solution.Wa, solution.Wb = Wa, Wb.detach()
        return solution

    dtype = torch.float64  # the least-squares and SVD steps are sensitive; the result is cast
    x, y = X.to(dtype), Y.to(dtype)
    x_mean, y_mean = x.mean(0), y.mean(0)
    xc, yc = x - x_mean, y - y_mean
    _, r = torch.linalg.qr(xc, mode="reduced")  # xc = q r, so ||xc w|| = ||r w||
    best = torch.linalg.lstsq(xc, yc).solution  # the unconstrained optimum
    u, s, vt = torch.linalg.svd(r @ best, full_matrices=False)
    root = s[:k].sqrt()
    left = torch.linalg.pinv(r) @ (u[:, :k] * root)  # [D, k]
    right = root[:, None] * vt[:k]  # [k, M]
    new_bias = y_mean - x_mean @ left @ right
    solution.Wa, solution.Wb = left.to(X.dtype), right.to(X.dtype)
    solution.bias, solution.rank = new_bias.to(X.dtype), k
    solution.nmse = _nmse(y, x @ left @ right + new_bias)
    return solution


def _unfolded(
    x: torch.Tensor, kernel_size, padding=0, padding_mode="zeros", stride=1, dilation=1, groups=1
) -> torch.Tensor:
    """Every `kernel_size` patch of `x` as a row `[N * positions, C_in * kh * kw]` (at stride 1,
    whatever the layer's stride: every position is a sample for the regression)."""
    del stride
    for name, value in (("dilation", dilation), ("groups", groups)):
        if value not in (1, (1, 1)):
            raise NotImplementedError(f"factorize_conv2d supports {name}=1 only, got {value}")
    if isinstance(padding, str):
        raise NotImplementedError(f"factorize_conv2d takes padding as ints, got {padding!r}")
    ph, pw = (padding, padding) if isinstance(padding, int) else tuple(padding)
    if padding_mode != "zeros" and (ph or pw):
        x, ph, pw = F.pad(x, (pw, pw, ph, ph), mode=padding_mode), 0, 0
    patches = F.unfold(x, kernel_size=kernel_size, padding=(ph, pw))  # [N, fan_in, positions]
    return patches.transpose(1, 2).reshape(-1, patches.shape[1])


def factorize_conv2d(
    X: torch.Tensor,
    Wa: torch.Tensor,
    Wb: torch.Tensor | None = None,
    rank: int | float = 0.25,
    biasA: torch.Tensor | None = None,
    biasB: torch.Tensor | None = None,
    n_iters: int = 3,
    **conv2d_kwargs,
) -> LowRankSolution:
    """A `kh x kw` convolution with `rank` output channels followed by a 1x1 one, fitted to
    reproduce the original convolution's outputs on the activations `X`.

    Args:
        X: activations `[N, C_in, H, W]` the convolution sees.
        Wa: the convolution's weight `[C_out, C_in, kh, kw]`, or the first factor
            `[d, C_in, kh, kw]` of one already factorized.
        Wb: the second factor `[C_out, d, 1, 1]` (progressive factorization), or None.
        rank: latent channels: an int, or a fraction of `C_in * kh * kw`.
        biasA: the bias of `Wa`'s convolution.
        biasB: the bias of `Wb`'s convolution (only with `Wb`).
        n_iters: as in `factorize_matrix` (accepted for Composer's calls).
        **conv2d_kwargs: the original convolution's `padding`, `padding_mode`, `stride`,
            `dilation`, `groups` (dilation and groups other than 1 are not supported).
    Returns:
        a `LowRankSolution` with `Wa` `[rank, C_in, kh, kw]`, `Wb` `[C_out, rank, 1, 1]` and the
        bias of the second convolution (or, at `rank == -1`, one convolution's weight).
    Raises:
        ValueError: `biasB` without `Wb`.
    """
    if biasB is not None and Wb is None:
        raise ValueError("biasB is the bias of Wb's convolution: pass Wb too (or drop biasB)")
    kernel_size = tuple(Wa.shape[2:])
    x = _unfolded(X.detach(), kernel_size, **conv2d_kwargs)
    a = Wa.detach().reshape(Wa.shape[0], -1).T  # [fan_in, d or C_out]
    y = x @ a + (0 if biasA is None else biasA.detach())
    b = None
    if Wb is not None:
        b = Wb.detach().reshape(Wb.shape[0], -1).T  # [d, C_out]
        y = y @ b + (0 if biasB is None else biasB.detach())
    solution = factorize_matrix(x, y, a, b, rank=rank, n_iters=n_iters)

    def as_kernel(mat, size):
        return None if mat is None else mat.T.reshape(mat.shape[1], -1, *size)

    solution.Wa = as_kernel(solution.Wa, kernel_size)
    solution.Wb = as_kernel(solution.Wb, (1, 1))
    return solution
