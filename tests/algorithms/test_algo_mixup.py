"""mixup transform: the step trains on mixup_batch with its key; identity at alpha 0; resumes.

The laws (purity, determinism under the key, identity at zero, commutation with label smoothing,
resume through `fit`) are checked with `functrain.testing`, as a user checks their own algorithm.
"""

import pytest
import torch
import torch.nn.functional as F
from data_algo_testing import (
    assert_resumes_exactly,
    assert_trains,
    assert_zero_strength_is_identity,
    digits_batches,
    setup,
)

from functrain.algorithms.label_smoothing import label_smoothing
from functrain.algorithms.mixed_targets import MixedTarget
from functrain.algorithms.mixup import mixup
from functrain.functional.mixup import mixup_batch
from functrain.rng import key_for
from functrain.testing import (
    check_commutes,
    check_determinism,
    check_identity_at_zero,
    check_purity,
    check_resume_equivalence,
)
from functrain.tree import tree_clone


@pytest.mark.parametrize("interpolate_loss", [False, True])
def test_step_trains_on_the_functional_core_with_the_step_key(interpolate_loss):
    step, state = setup([mixup(0.4, interpolate_loss=interpolate_loss)])
    x, y = digits_batches(1)[0]
    x_mixed, y_perm, mixing = mixup_batch(
        x, y, alpha=0.4, generator=key_for(state.rng, state.step, "mixup")
    )
    prepared = step.pieces.prepare(state, (x, y))
    assert torch.equal(prepared[0], x_mixed)
    assert isinstance(prepared[1], MixedTarget) and prepared[1].original is y
    assert torch.equal(prepared[1].permuted, y_perm)
    assert float(prepared[1].original_weight) == pytest.approx(1 - mixing)
    assert float(prepared[1].permuted_weight) == pytest.approx(mixing)
    assert prepared[1].interpolate_loss == interpolate_loss
    out = step.call_model(tree_clone(state), x_mixed)
    _, metrics = step(state, (x, y))
    if interpolate_loss:
        expected = (1 - mixing) * F.cross_entropy(out, y) + mixing * F.cross_entropy(out, y_perm)
    else:
        dense = (1 - mixing) * F.one_hot(y, 10).float() + mixing * F.one_hot(y_perm, 10).float()
        expected = F.cross_entropy(out, dense)
    assert torch.allclose(metrics["loss"], expected, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_mixed_batch_and_loss_by_hand(seed):
    """Independent of `mixup_batch`: each input is `(1 - m) x_i + m x_perm(i)` for one
    permutation, read off the targets (labels 0..9 are distinct, so they name the samples)."""
    step, state = setup([mixup(0.4)], seed=seed)
    x = digits_batches(1)[0][0][:10]
    y = torch.arange(10)
    prepared = step.pieces.prepare(state, (x, y))
    target = prepared[1]
    perm = target.permuted
    assert sorted(perm.tolist()) == list(range(10))  # a permutation of the batch
    assert torch.equal(target.original, y)
    m = float(target.permuted_weight)
    assert 0.0 <= m <= 1.0 and abs(float(target.original_weight) - (1 - m)) < 1e-6
    assert 0.0 < m < 1.0  # Beta(0.4, 0.4) draws are never exactly 0 or 1
    expected = torch.stack([(1 - m) * x[i] + m * x[int(perm[i])] for i in range(10)])
    torch.testing.assert_close(prepared[0], expected, rtol=1e-6, atol=1e-6)
    # the loss: cross entropy on the mixed one-hot targets, by hand
    out = step.call_model(tree_clone(state), expected)
    dense = torch.zeros(10, 10)
    dense[torch.arange(10), y] += 1 - m
    dense[torch.arange(10), perm] += m
    by_hand = -(dense * torch.log_softmax(out, dim=1)).sum(1).mean()
    _, metrics = step(state, (x, y))
    torch.testing.assert_close(metrics["loss"], by_hand, rtol=1e-5, atol=1e-6)


def test_alpha_zero_is_the_identity_and_input_batch_is_untouched():
    assert_zero_strength_is_identity(mixup(alpha=0.0))
    step, state = setup([mixup(1.0)])
    x, y = digits_batches(1)[0]
    x0, y0 = x.clone(), y.clone()
    step(state, (x, y))
    assert torch.equal(x, x0) and torch.equal(y, y0)


def test_trains_and_resumes_exactly():
    assert_trains(lambda: mixup(0.2))
    assert_resumes_exactly(lambda: mixup(0.2))


@pytest.mark.parametrize("interpolate_loss", [False, True])
def test_laws(interpolate_loss):
    options = {"interpolate_loss": interpolate_loss}
    check_purity(mixup(0.4, **options))
    check_determinism(mixup(0.4, **options), varies_with_key=True)
    check_identity_at_zero(mixup, strength="alpha", options=options)
    # Any order with label smoothing (the target markers nest); the two orders sum the smoothed
    # losses in another order, so equal up to float rounding.
    check_commutes(mixup(0.4, **options), label_smoothing(0.1), atol=1e-6)


def test_resumes_exactly_through_fit():
    check_resume_equivalence(lambda: mixup(0.4))
