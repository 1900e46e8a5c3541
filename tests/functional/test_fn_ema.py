"""compute_ema: smoothing 0 is the model, 1 keeps the average, half-life halves old shares."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.ema import compute_ema, smoothing_from_half_life

pairs = st.integers(0, 10_000).map(
    lambda s: (
        {"w": torch.randn(3, 2, generator=torch.Generator().manual_seed(s)), "n": torch.tensor(s)},
        {
            "w": torch.randn(3, 2, generator=torch.Generator().manual_seed(s + 1)),
            "n": torch.tensor(0),
        },
    )
)


@settings(max_examples=40, deadline=None)
@given(pair=pairs, smoothing=st.floats(0.0, 1.0))
def test_recurrence_and_endpoints(pair, smoothing):
    model, average = pair
    out = compute_ema(model, average, smoothing)
    torch.testing.assert_close(out["w"], smoothing * average["w"] + (1 - smoothing) * model["w"])
    assert torch.equal(out["n"], model["n"])  # integer tensors are copied
    assert torch.equal(compute_ema(model, average, 0.0)["w"], model["w"])
    assert torch.equal(compute_ema(model, average, 1.0)["w"], average["w"])
    assert out["w"] is not average["w"] and out["w"] is not model["w"]


@settings(max_examples=20, deadline=None)
@given(half_life=st.integers(1, 50), interval=st.integers(1, 5))
def test_half_life_halves_an_old_share(half_life, interval):
    smoothing = smoothing_from_half_life(half_life, interval)
    updates = half_life / interval
    assert smoothing**updates == pytest.approx(0.5)


def test_errors():
    assert smoothing_from_half_life(0) == 0.0
    with pytest.raises(ValueError, match="smoothing"):
        compute_ema({"w": torch.ones(1)}, {"w": torch.ones(1)}, 1.5)
    with pytest.raises(KeyError, match="names"):
        compute_ema({"w": torch.ones(1)}, {"v": torch.ones(1)}, 0.5)


def test_half_life_in_updates_by_default():
    # The default interval is one update: a half-life of 1 halves every update, of 2 takes
    # sqrt(1/2) per update, of 4 takes 2 ** (-1/4) = 0.8409.
    assert smoothing_from_half_life(1) == 0.5
    assert smoothing_from_half_life(2) == pytest.approx(0.5**0.5, rel=1e-12)
    assert smoothing_from_half_life(4) == pytest.approx(0.8408964152537145, rel=1e-12)
    assert smoothing_from_half_life(4, 2) == pytest.approx(0.5**0.5, rel=1e-12)


@pytest.mark.parametrize(
    ("half_life", "interval"), [(-1.0, 1.0), (5.0, 0.0), (5.0, -1.0), (-1.0, -1.0)]
)
def test_each_bad_half_life_argument_is_rejected_on_its_own(half_life, interval):
    with pytest.raises(ValueError, match="half_life must be >= 0 and update_interval > 0"):
        smoothing_from_half_life(half_life, interval)


@pytest.mark.parametrize("smoothing", [-0.5, -1e-9, 1.0 + 1e-9, 2.0])
def test_smoothing_outside_the_unit_interval_is_rejected(smoothing):
    with pytest.raises(ValueError, match="EMA smoothing must be in \\[0, 1\\]"):
        compute_ema({"w": torch.ones(1)}, {"w": torch.zeros(1)}, smoothing)
