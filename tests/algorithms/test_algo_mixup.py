"""mixup transform: the step trains on mixup_batch with its key; identity at alpha 0; resumes."""

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

from functrain.algorithms.mixed_targets import MixedTarget
from functrain.algorithms.mixup import mixup
from functrain.functional.mixup import mixup_batch
from functrain.rng import key_for
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
