"""randaugment_batch/_image: identity at depth 0, per-image chains, determinism, dtype/range."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.randaugment import randaugment_batch, randaugment_image


def _identity(images, level, generator):
    torch.rand(images.shape[0], generator=generator)  # draws like a real operation
    return images.clone()


def _invert(images, level, generator):
    return 1 - images


@settings(max_examples=20, deadline=None)
@given(severity=st.floats(0, 10), depth=st.integers(0, 3), seed=st.integers(0, 10**6))
def test_randaugment_is_keyed_pure_and_keeps_shape_and_range(severity, depth, seed):
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    x0 = x.clone()
    out = randaugment_batch(x, severity, depth, generator=torch.Generator().manual_seed(seed))
    assert out.shape == x.shape and float(out.min()) >= 0 and float(out.max()) <= 1 + 1e-6
    again = randaugment_batch(x, severity, depth, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(out, again) and torch.equal(x, x0)
    if depth == 0:
        assert out is x  # zero strength: the identity, no generator needed


def test_chains_apply_depth_operations_per_image():
    x = torch.rand(5, 1, 4, 4)
    gen = torch.Generator().manual_seed(0)
    assert torch.allclose(randaugment_batch(x, 9, 3, [_identity], generator=gen), x)
    # inverting twice is the identity, three times an inversion: every image got exactly `depth`
    assert torch.allclose(randaugment_batch(x, 9, 2, [_invert], generator=gen), x)
    assert torch.allclose(randaugment_batch(x, 9, 3, [_invert], generator=gen), 1 - x)


def test_single_images_uint8_and_value_ranges():
    img = torch.randint(0, 256, (3, 6, 6), dtype=torch.uint8)
    out = randaugment_image(img, generator=torch.Generator().manual_seed(1))
    assert out.shape == img.shape and out.dtype == torch.uint8
    normalized = torch.randn(2, 1, 6, 6).clamp(-2, 2)
    out = randaugment_batch(
        normalized, value_range=(-2.0, 2.0), generator=torch.Generator().manual_seed(1)
    )
    assert float(out.min()) >= -2 and float(out.max()) <= 2
    with pytest.raises(ValueError, match="generator="):
        randaugment_batch(torch.rand(1, 1, 4, 4))
    with pytest.raises(ValueError, match="depth"):
        randaugment_batch(torch.rand(1, 1, 4, 4), depth=-1)


def _recorder(calls):
    def op(images, level, generator):
        calls.append((level, images.clone()))
        return images

    return op


@pytest.mark.parametrize(
    "fn, x", [(randaugment_batch, (2, 1, 3, 3)), (randaugment_image, (1, 3, 3))]
)
def test_the_defaults_are_severity_9_depth_2_and_unit_float_images(fn, x):
    calls = []
    x = torch.rand(x, generator=torch.Generator().manual_seed(0))
    out = fn(x, augmentation_set=[_recorder(calls)], generator=torch.Generator().manual_seed(0))
    assert [level for level, _ in calls] == [9, 9]  # depth 2, each link at severity 9
    # the default value range is [0, 1]: the operation sees the images as they are
    batch = x if x.dim() == 4 else x.unsqueeze(0)
    assert all(torch.equal(seen, batch) for _, seen in calls)
    assert torch.equal(out, x)


def test_an_empty_batch_is_returned_without_a_generator():
    empty = torch.rand(0, 3, 4, 4)
    assert randaugment_batch(empty) is empty
