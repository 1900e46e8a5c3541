"""progressive_resizing transform: image size follows the schedule of the run; resumes exactly."""

import pytest
from data_algo_testing import (
    assert_resumes_exactly,
    assert_trains,
    assert_zero_strength_is_identity,
    digits_batches,
    setup,
)

from functrain.algorithms.progressive_resizing import progressive_resizing
from functrain.functional.progressive_resizing import pin_scale, progressive_scale


@pytest.mark.parametrize("mode", ["resize", "crop"])
def test_image_size_follows_the_schedule_over_the_run(mode):
    algorithm = progressive_resizing(
        mode, initial_scale=0.25, finetune_fraction=0.2, delay_fraction=0.3, size_increment=2
    )
    step, state = setup([algorithm], max_batches=10)
    x, y = digits_batches(1)[0]
    for batch in range(11):
        ts = state.timestamp.replace(batch=batch)
        new_x, new_y = step.pieces.prepare(state.replace(timestamp=ts), (x, y))
        scale = pin_scale(8, progressive_scale(batch / 10, 0.25, 0.2, 0.3), 2)
        side = 8 if scale >= 1 else int(8 * scale)
        assert new_x.shape == (32, 1, side, side) and new_y is y


def test_full_initial_scale_is_the_identity_and_the_run_length_is_required():
    assert_zero_strength_is_identity(progressive_resizing(initial_scale=1.0))
    step, state = setup([progressive_resizing()])
    state = state.replace(timestamp=state.timestamp.replace(max_batches=0))
    with pytest.raises(ValueError, match="run's length"):
        step.pieces.prepare(state, digits_batches(1)[0])
    with pytest.raises(ValueError, match="delay_fraction"):
        progressive_resizing(delay_fraction=0.9, finetune_fraction=0.2)


def test_trains_and_resumes_exactly():
    assert_trains(lambda: progressive_resizing(delay_fraction=0.0, finetune_fraction=0.5))
    assert_resumes_exactly(
        lambda: progressive_resizing("crop", delay_fraction=0.0, finetune_fraction=0.5)
    )
