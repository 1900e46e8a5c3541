"""mixup_batch: Composer's coefficient and permutation, the convex-hull law, purity, determinism."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.mixup import mixup_batch, sample_mixing


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 9), d=st.integers(1, 5), alpha=st.floats(0.05, 5.0), seed=st.integers(0, 10**6)
)
def test_mixed_inputs_lie_between_the_pair_and_labels_follow_the_permutation(n, d, alpha, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    y = torch.randint(0, 5, (n,), generator=gen)
    x0, y0 = x.clone(), y.clone()
    mixed, y_perm, mixing = mixup_batch(
        x, y, alpha=alpha, generator=torch.Generator().manual_seed(seed)
    )
    assert 0.0 <= mixing <= 0.5  # the original example always dominates
    again = mixup_batch(x, y, alpha=alpha, generator=torch.Generator().manual_seed(seed))
    assert again[2] == mixing and torch.equal(again[0], mixed)  # deterministic under a key
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    mixed, y_perm, _ = mixup_batch(x, y, mixing=mixing, indices=perm)
    assert torch.equal(y_perm, y[perm])
    assert torch.allclose(mixed, (1 - mixing) * x + mixing * x[perm])
    lo, hi = torch.minimum(x, x[perm]), torch.maximum(x, x[perm])
    assert bool(((mixed >= lo - 1e-6) & (mixed <= hi + 1e-6)).all())  # convex hull of the pair
    assert torch.equal(x, x0) and torch.equal(y, y0)  # pure


def test_zero_strength_is_the_identity():
    x, y = torch.randn(4, 3), torch.arange(4)
    mixed, _, mixing = mixup_batch(x, y, alpha=0.0, generator=torch.Generator().manual_seed(0))
    assert mixing == 0.0 and torch.equal(mixed, x)
    assert sample_mixing(0.0, None) == 0.0  # no draw, no generator needed


def test_explicit_values_need_no_generator_and_match_composer_formula():
    x = torch.tensor([[0.0, 1.0], [4.0, 5.0]])
    mixed, y_perm, mixing = mixup_batch(
        x, torch.tensor([7, 9]), mixing=0.25, indices=torch.tensor([1, 0])
    )
    assert torch.equal(mixed, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.equal(y_perm, torch.tensor([9, 7])) and mixing == 0.25


def test_targets_may_be_a_pytree_and_errors_are_clear():
    x = torch.randn(3, 2)
    target = (torch.arange(3), torch.arange(6).view(3, 2))
    _, perm_target, _ = mixup_batch(x, target, mixing=0.1, indices=torch.tensor([2, 0, 1]))
    assert torch.equal(perm_target[0], torch.tensor([2, 0, 1]))
    with pytest.raises(ValueError, match="generator="):
        mixup_batch(x, torch.arange(3))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mixup_batch(x, torch.arange(3), mixing=1.5, indices=torch.arange(3))
    with pytest.raises(ValueError, match="permutation of 3"):
        mixup_batch(x, torch.arange(3), mixing=0.1, indices=torch.arange(2))


def test_the_default_alpha_is_composers_0_2():
    # E[min(z, 1 - z)] for z ~ Beta(a, a), by a midpoint rule over [0, 1/2] (independent of the
    # code; 1/4 at a=1 as it must be): a=0.2: 0.101; a=1.2: 0.267. 400 draws: standard error ~0.005.
    import math

    def expected(a, n=200_000):
        log_beta = 2 * math.lgamma(a) - math.lgamma(2 * a)
        z = (torch.arange(n, dtype=torch.float64) + 0.5) / (2 * n)
        pdf = torch.exp((a - 1) * torch.log(z) + (a - 1) * torch.log1p(-z) - log_beta)
        return float(2 * (z * pdf).sum() / (2 * n))

    gen = torch.Generator().manual_seed(0)
    x, y = torch.zeros(4, 2), torch.arange(4)
    draws = [mixup_batch(x, y, generator=gen)[2] for _ in range(400)]
    mean = sum(draws) / len(draws)
    assert abs(mean - expected(0.2)) < 0.025 < abs(mean - expected(1.2))
