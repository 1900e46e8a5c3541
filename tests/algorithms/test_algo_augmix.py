"""augmix transform: per-image AugMix from the step key inside the step; resumes exactly."""

import pytest
import torch
from data_algo_testing import assert_resumes_exactly, assert_trains, digits_batches, setup

from functrain.algorithms.augmix import augmix
from functrain.functional.augmix import augmix_batch
from functrain.rng import key_for


def test_step_images_are_the_functional_core_with_the_step_key():
    step, state = setup([augmix(severity=3, width=2)])
    x, y = digits_batches(1)[0]
    expected = augmix_batch(x, 3, -1, 2, 1.0, generator=key_for(state.rng, 0, "augmix"))
    new_x, _ = step.pieces.prepare(state, (x, y))
    assert torch.equal(new_x, expected)
    assert float(new_x.min()) >= 0 and float(new_x.max()) <= 1


def test_trains_and_resumes_exactly():
    assert_trains(lambda: augmix(width=2))
    assert_resumes_exactly(lambda: augmix(width=2))


def test_bad_arguments_fail_early():
    with pytest.raises(ValueError, match="alpha"):
        augmix(alpha=0)
    with pytest.raises(ValueError, match="width"):
        augmix(width=0)
