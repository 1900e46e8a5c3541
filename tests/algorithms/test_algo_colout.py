"""colout transform: batch-wise and per-image row/column drops; identity at zero; resumes."""

import torch
from data_algo_testing import (
    assert_resumes_exactly,
    assert_trains,
    assert_zero_strength_is_identity,
    digits_batches,
    setup,
)

from functrain.algorithms.colout import colout
from functrain.functional.colout import colout_batch
from functrain.rng import key_for


def test_batch_mode_is_the_functional_core_with_the_step_key():
    step, state = setup([colout(0.25, 0.25)])
    x, y = digits_batches(1)[0]
    expected = colout_batch(x, 0.25, 0.25, generator=key_for(state.rng, 0, "colout"))
    new_x, new_y = step.pieces.prepare(state, (x, y))
    assert new_x.shape == (32, 1, 6, 6) and torch.equal(new_x, expected) and new_y is y


def test_per_image_mode_draws_each_image_separately_and_cuts_image_targets_alike():
    step, state = setup([colout(0.5, 0.5, batch=False)])
    rows = torch.arange(8.0).view(1, 1, 8, 1).expand(6, 1, 8, 8)
    x = rows * 10 + torch.arange(8.0).view(1, 1, 1, 8)
    seg = x[:, 0].clone()
    new_x, new_seg = step.pieces.prepare(state, (x, seg))
    assert new_x.shape == (6, 1, 4, 4) and torch.equal(new_seg, new_x[:, 0])
    kept_rows = {tuple((new_x[i, 0, :, 0] // 10).tolist()) for i in range(6)}
    assert len(kept_rows) > 1  # images drew different rows


def test_zero_strength_is_the_identity():
    assert_zero_strength_is_identity(colout(0.0, 0.0))


def test_trains_and_resumes_exactly():
    assert_trains(lambda: colout())
    assert_resumes_exactly(lambda: colout(batch=False))
