"""The data-algorithm skeleton: keyed generators, the run-fraction clock, list order of prepares."""

import pytest
import torch
from data_algo_testing import digits_batches, setup

from functrain.algorithms.batch_transform import (
    batch_algorithm,
    elapsed_duration,
    image_batch_algorithm,
    step_generator,
)
from functrain.rng import RngState


class _State:
    layout = None  # one process: the generators use data-parallel rank 0

    def __init__(self, step, rng=RngState(0)):
        self.step, self.rng = step, rng


def test_generators_are_keyed_by_seed_step_and_purpose():
    def draw(state, purpose):
        return torch.rand(3, generator=step_generator(state, purpose))

    assert torch.equal(draw(_State(4), "mixup"), draw(_State(4), "mixup"))
    assert not torch.equal(draw(_State(4), "mixup"), draw(_State(5), "mixup"))
    assert not torch.equal(draw(_State(4), "mixup"), draw(_State(4), "cutmix"))
    assert not torch.equal(draw(_State(4), "mixup"), draw(_State(4, RngState(1)), "mixup"))


def test_elapsed_duration_needs_the_run_length():
    _, state = setup([], max_batches=8)
    assert elapsed_duration(state, "x") == 0.0
    state = state.replace(timestamp=state.timestamp.replace(max_batches=0))
    with pytest.raises(ValueError, match="functrain.fit"):
        elapsed_duration(state, "progressive_resizing")


def test_later_algorithms_in_the_list_see_the_earlier_ones_output():
    add_one = batch_algorithm("add_one", lambda s, b: (b[0] + 1, b[1]))
    double = batch_algorithm("double", lambda s, b: (b[0] * 2, b[1]))
    x, y = digits_batches(1)[0]
    step_ab, state = setup([add_one, double])
    step_ba, _ = setup([double, add_one])
    assert torch.equal(step_ab.pieces.prepare(state, (x, y))[0], (x + 1) * 2)
    assert torch.equal(step_ba.pieces.prepare(state, (x, y))[0], x * 2 + 1)


def test_image_algorithms_replace_the_images_using_the_step_key():
    seen = []

    def augment(images, generator):
        seen.append(torch.rand(1, generator=generator))
        return images.flip(-1)

    step, state = setup([image_batch_algorithm("flip", 0, augment)])
    x, y = digits_batches(1)[0]
    new_x, new_y = step.pieces.prepare(state, (x, y))
    assert torch.equal(new_x, x.flip(-1)) and new_y is y
    assert torch.equal(seen[0], torch.rand(1, generator=step_generator(state, "flip")))


def test_image_algorithms_need_image_batches_at_their_key():
    step, state = setup([image_batch_algorithm("flip", 0, lambda images, g: images)])
    x, y = digits_batches(1)[0]
    with pytest.raises(TypeError, match=r"flip needs \(N, C, H, W\) image tensors at key 0"):
        step.pieces.prepare(state, (x.flatten(1), y))
