"""randaugment transform: per-image chains from the step key inside the step; identity; resumes."""

import pytest
import torch
from data_algo_testing import (
    assert_resumes_exactly,
    assert_trains,
    assert_zero_strength_is_identity,
    digits_batches,
    setup,
)

from functrain.algorithms.randaugment import randaugment
from functrain.functional.randaugment import randaugment_batch
from functrain.rng import key_for


def test_step_images_are_the_functional_core_with_the_step_key():
    step, state = setup([randaugment(severity=5, depth=2, augmentation_set="safe")])
    x, y = digits_batches(1)[0]
    expected = randaugment_batch(x, 5, 2, "safe", generator=key_for(state.rng, 0, "randaugment"))
    new_x, _ = step.pieces.prepare(state, (x, y))
    assert torch.equal(new_x, expected)


def test_zero_depth_is_the_identity_and_bad_arguments_fail_early():
    assert_zero_strength_is_identity(randaugment(depth=0))
    with pytest.raises(KeyError, match="augmentation_set"):
        randaugment(augmentation_set="everything")
    with pytest.raises(ValueError, match="severity"):
        randaugment(severity=12)


def test_trains_and_resumes_exactly():
    assert_trains(lambda: randaugment(severity=3))
    assert_resumes_exactly(lambda: randaugment())
