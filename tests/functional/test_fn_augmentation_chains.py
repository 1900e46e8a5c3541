"""Augmentation chains: grouped per-operation application, per-image chain lengths, one image."""

import pytest
import torch

from functrain.functional.augmentation_chains import (
    apply_chain_step,
    apply_random_chain,
    on_image_or_batch,
)


def _adds(amount):
    def op(images, level, generator):
        torch.rand(images.shape[0], generator=generator)  # draws a strength, as real ops do
        return images + amount

    return op


def test_each_image_gets_its_chosen_operation_where_active():
    images = torch.zeros(5, 1, 2, 2)
    ops = [_adds(1.0), _adds(10.0), _adds(100.0)]
    choice = torch.tensor([0, 1, 2, 1, 0])
    active = torch.tensor([True, True, False, True, True])
    out = apply_chain_step(images, choice, ops, 5, torch.Generator().manual_seed(0), active)
    assert out[:, 0, 0, 0].tolist() == [1.0, 10.0, 0.0, 10.0, 1.0]
    assert torch.equal(images, torch.zeros(5, 1, 2, 2))  # the input is not modified


def test_operations_see_only_their_images():
    seen = []

    def record(images, level, generator):
        seen.append(images[:, 0, 0, 0].tolist())
        return images

    images = torch.arange(4.0).view(4, 1, 1, 1)
    apply_chain_step(images, torch.tensor([1, 0, 1, 1]), [record, record], 3, None)
    assert seen == [[1.0], [0.0, 2.0, 3.0]]  # grouped, in the order of the operation list


def test_a_chain_of_int_depth_applies_that_many_operations_to_every_image():
    ops = [_adds(1.0), _adds(1.0)]
    out = apply_random_chain(torch.zeros(6, 1, 1, 1), ops, 9, torch.Generator().manual_seed(1), 3)
    assert out.flatten().tolist() == [3.0] * 6


def test_per_image_depths_stop_each_image_at_its_own_length():
    ops = [_adds(1.0), _adds(2.0)]
    depths = torch.tensor([0, 1, 3, 2])
    out = apply_random_chain(
        torch.zeros(4, 1, 1, 1), ops, 9, torch.Generator().manual_seed(2), depths
    )
    gen = torch.Generator().manual_seed(2)  # replay the draws: per link the choices, then strengths
    expected = torch.zeros(4)
    for link in range(3):
        choice = torch.randint(2, (4,), generator=gen)
        for k in range(2):
            rows = (choice == k) & (depths > link)
            if rows.any():
                torch.rand(int(rows.sum()), generator=gen)
                expected[rows] += k + 1.0
    assert out.flatten().tolist() == expected.tolist()
    assert out[0].item() == 0.0


def test_the_draws_do_not_depend_on_other_images_depths():
    ops = [_adds(1.0), _adds(5.0)]
    x = torch.zeros(3, 1, 1, 1)
    short = apply_random_chain(x, ops, 9, torch.Generator().manual_seed(3), torch.tensor([1, 1, 1]))
    mixed = apply_random_chain(x, ops, 9, torch.Generator().manual_seed(3), torch.tensor([1, 1, 3]))
    # image 0's one-link chain is the same whether image 2's chain has 1 or 3 links
    assert short[0].item() == mixed[0].item()


@pytest.mark.parametrize("shape", [(3, 4, 4), (2, 3, 4, 4)])
def test_one_image_or_a_batch(shape):
    calls = []

    def batch_fn(images, scale, *, offset=0.0):
        calls.append(tuple(images.shape))
        return images * scale + offset

    img = torch.ones(shape)
    out = on_image_or_batch(batch_fn, img, 2.0, offset=1.0)
    assert out.shape == img.shape and torch.equal(out, torch.full(shape, 3.0))
    assert calls == [(1, *shape) if len(shape) == 3 else shape]


def test_an_operation_no_image_chose_is_not_called():
    calls = []

    def record(name):
        def op(images, level, generator):
            calls.append((name, images.shape[0]))
            return images

        return op

    images = torch.zeros(3, 1, 1, 1)
    ops = [record("a"), record("b"), record("c")]
    apply_chain_step(images, torch.tensor([2, 0, 2]), ops, 3, None)
    assert calls == [("a", 1), ("c", 2)]  # "b" drew no image: no call with an empty batch
    calls.clear()
    apply_chain_step(images, torch.tensor([1, 1, 1]), ops, 3, None, torch.zeros(3, dtype=bool))
    assert calls == []  # no image active: nothing is called
