"""cutmix transform: trains on cutmix_batch with the step key, area-weighted targets; resumes."""

import pytest
import torch
import torch.nn.functional as F
from data_algo_testing import assert_resumes_exactly, assert_trains, digits_batches, setup

from functrain.algorithms.cutmix import cutmix
from functrain.algorithms.mixed_targets import MixedTarget
from functrain.functional.cutmix import cutmix_batch
from functrain.rng import key_for
from functrain.tree import tree_clone


@pytest.mark.parametrize("interpolate_loss", [False, True])
def test_step_trains_on_the_functional_core_with_area_weights(interpolate_loss):
    step, state = setup([cutmix(1.0, interpolate_loss=interpolate_loss)])
    x, y = digits_batches(1)[0]
    mixed, y_perm, area, _ = cutmix_batch(
        x, y, alpha=1.0, generator=key_for(state.rng, 0, "cutmix")
    )
    prepared = step.pieces.prepare(state, (x, y))
    assert torch.equal(prepared[0], mixed)
    target = prepared[1]
    assert isinstance(target, MixedTarget) and torch.equal(target.permuted, y_perm)
    assert float(target.original_weight) == pytest.approx(area)
    assert float(target.permuted_weight) == pytest.approx(1 - area)
    out = step.call_model(tree_clone(state), mixed)
    _, metrics = step(state, (x, y))
    dense = area * F.one_hot(y, 10).float() + (1 - area) * F.one_hot(y_perm, 10).float()
    assert torch.allclose(metrics["loss"], F.cross_entropy(out, dense), atol=1e-6)


def test_segmentation_targets_get_the_box_pasted():
    step, state = setup([cutmix(1.0)])
    x = torch.rand(4, 1, 8, 8)
    seg = torch.arange(4).view(4, 1, 1).expand(4, 8, 8).clone()  # image i is all class i
    new_x, new_seg = step.pieces.prepare(state, (x, seg))
    # Every pixel's label names the image its pixel came from.
    source = torch.stack([(new_x[i] == x[j]).all(0) for i in range(4) for j in range(4)]).view(
        4, 4, 8, 8
    )
    for i in range(4):
        assert bool(source[i].gather(0, new_seg[i].unsqueeze(0)).all())


def test_trains_and_resumes_exactly():
    assert_trains(lambda: cutmix(1.0))
    assert_resumes_exactly(lambda: cutmix(1.0, uniform_sampling=True))


def test_non_image_inputs_are_rejected():
    step, state = setup([cutmix()])
    with pytest.raises(TypeError, match=r"\(N, C, H, W\)"):
        step.pieces.prepare(state, (torch.zeros(4, 64), torch.arange(4)))
