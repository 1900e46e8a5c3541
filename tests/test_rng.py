"""Counter-based keys: determinism, independence of purposes, global RNG untouched."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.rng import RngState, key_for, seed_for, seeded_global_rng, split


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), step=st.integers(0, 10**6), rank=st.integers(0, 7))
def test_same_inputs_same_draws(seed, step, rank):
    rng = RngState(seed)
    a = torch.rand(4, generator=key_for(rng, step, "mixup", rank))
    b = torch.rand(4, generator=key_for(rng, step, "mixup", rank))
    assert torch.equal(a, b)


def test_purposes_steps_ranks_and_splits_differ():
    rng = RngState(0)
    seeds = {
        seed_for(rng, 1, "mixup"),
        seed_for(rng, 1, "cutmix"),
        seed_for(rng, 2, "mixup"),
        seed_for(rng, 1, "mixup", rank=1),
        seed_for(split(rng)[0], 1, "mixup"),
    }
    assert len(seeds) == 5


def test_seeded_global_rng_restores_the_global_generator():
    before = torch.get_rng_state()
    with seeded_global_rng(7):
        a = torch.rand(3)
    with seeded_global_rng(7):
        b = torch.rand(3)
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), before)
