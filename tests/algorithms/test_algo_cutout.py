"""cutout transform: the step's images are cutout_batch with the step key; identity; resumes."""

import torch
from data_algo_testing import (
    assert_resumes_exactly,
    assert_trains,
    assert_zero_strength_is_identity,
    digits_batches,
    setup,
)

from functrain.algorithms.cutout import cutout
from functrain.functional.cutout import cutout_batch
from functrain.rng import key_for


def test_step_images_are_the_functional_core_with_the_step_key():
    step, state = setup([cutout(num_holes=2, length=0.25)])
    x, y = digits_batches(1)[0]
    expected = cutout_batch(x, 2, 0.25, generator=key_for(state.rng, 0, "cutout"))
    new_x, new_y = step.pieces.prepare(state, (x, y))
    assert torch.equal(new_x, expected) and new_y is y
    later = step.pieces.prepare(state.replace(step=1), (x, y))[0]
    assert not torch.equal(later, new_x)  # a new draw every step


def test_zero_strength_is_the_identity():
    assert_zero_strength_is_identity(cutout(num_holes=0))
    assert_zero_strength_is_identity(cutout(length=0.0))


def test_trains_and_resumes_exactly():
    assert_trains(lambda: cutout())
    assert_resumes_exactly(lambda: cutout())
