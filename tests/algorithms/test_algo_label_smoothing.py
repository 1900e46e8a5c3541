"""label_smoothing transform: trains on Composer's smoothed targets; identity at 0; resumes exactly.

The laws are also checked with `functrain.testing`, as a user checks their own algorithm.
"""

import pytest
import torch
from data_algo_testing import (
    assert_resumes_exactly,
    assert_trains,
    assert_zero_strength_is_identity,
    digits_batches,
    setup,
)

from functrain.algorithms.label_smoothing import label_smoothing
from functrain.optim import adamw
from functrain.testing import (
    check_determinism,
    check_identity_at_zero,
    check_purity,
    check_resume_equivalence,
)
from functrain.tree import tree_clone


def test_loss_is_cross_entropy_on_smoothed_targets():
    step, state = setup([label_smoothing(0.2)])
    x, y = digits_batches(1)[0]
    out = step.call_model(tree_clone(state), x)
    _, metrics = step(state, (x, y))
    # by hand: 0.8 on the true class plus 0.2 spread over the 10 classes
    targets = torch.full_like(out, 0.2 / 10)
    targets[torch.arange(len(y)), y] += 0.8
    expected = -(targets * torch.log_softmax(out, dim=1)).sum(1).mean()
    assert torch.allclose(metrics["loss"], expected, atol=1e-6)
    assert torch.equal(metrics["accuracy"], (out.argmax(1) == y).float().mean())


def test_zero_smoothing_is_the_identity():
    assert_zero_strength_is_identity(label_smoothing(0.0))


def test_trains_and_resumes_exactly():
    assert_trains(lambda: label_smoothing(0.1))
    assert_resumes_exactly(lambda: label_smoothing(0.1))


def test_bad_smoothing_is_rejected():
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothing(-0.1)


def test_laws():
    check_purity(label_smoothing(0.2))
    check_determinism(label_smoothing(0.2))
    check_identity_at_zero(label_smoothing, strength="smoothing")
    check_identity_at_zero(label_smoothing, strength="smoothing", optimizer=adamw(1e-2))


def test_resumes_exactly_through_fit():
    check_resume_equivalence(lambda: label_smoothing(0.1))
