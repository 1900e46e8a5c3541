"""SWA cores: the running mean is the arithmetic mean; the lr curve anneals then holds."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.swa import normalize_anneal_strategy, swa_average, swa_lr


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 8), seed=st.integers(0, 1000))
def test_running_mean_equals_the_mean(n, seed):
    g = torch.Generator().manual_seed(seed)
    samples = [{"w": torch.randn(4, generator=g, dtype=torch.float64)} for _ in range(n)]
    average = {"w": torch.full((4,), 123.0, dtype=torch.float64)}  # ignored while empty
    for count, sample in enumerate(samples):
        average = swa_average(average, sample, count)
    torch.testing.assert_close(average["w"], torch.stack([s["w"] for s in samples]).mean(0))


@settings(max_examples=30, deadline=None)
@given(
    start=st.floats(1e-4, 1.0),
    target=st.floats(1e-4, 1.0),
    steps=st.integers(1, 20),
    strategy=st.sampled_from(["linear", "cos"]),
)
def test_lr_curve_endpoints_and_monotonicity(start, target, steps, strategy):
    values = [swa_lr(start, target, k, steps, strategy) for k in range(steps + 3)]
    assert values[0] == pytest.approx(start) and values[-1] == pytest.approx(target)
    diffs = [b - a for a, b in zip(values, values[1:])]
    assert all(d * (target - start) >= -1e-12 for d in diffs)


def test_strategy_names_and_errors():
    assert (
        normalize_anneal_strategy("Cosine") == "cos"
        and normalize_anneal_strategy("lin") == "linear"
    )
    assert swa_lr(1.0, 0.0, 1, 2, "cos") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="anneal_strategy"):
        normalize_anneal_strategy("step")
    with pytest.raises(ValueError, match="anneal_steps"):
        swa_lr(1.0, 0.1, 0, 0)
    with pytest.raises(ValueError, match="num_averaged"):
        swa_average({}, {}, -1)


def test_lr_a_quarter_of_the_way_linear_by_default_and_cosine():
    # From 1 to 0 over 4 updates, after 1: linear gives 1 - 1/4; the cosine curve
    # (1 - cos(pi / 4)) / 2 = 0.1464 of the way, so 0.8536. (Halfway both give 0.5.)
    assert swa_lr(1.0, 0.0, 1, 4) == pytest.approx(0.75)
    assert swa_lr(1.0, 0.0, 1, 4, "cos") == pytest.approx(0.8535533905932737)
    assert swa_lr(0.2, 1.0, 3, 4, "linear") == pytest.approx(0.8)
    assert swa_lr(1.0, 0.0, -3, 4) == 1.0  # no update yet counts as the start


def test_integer_tensors_are_copied_and_later_floats_still_averaged():
    average = {"n": torch.tensor(5), "w": torch.tensor([1.0, 4.0])}
    sample = {"n": torch.tensor(9), "w": torch.tensor([4.0, 1.0])}
    out = swa_average(average, sample, num_averaged=2)  # (2 * [1, 4] + [4, 1]) / 3
    assert out.keys() == {"n", "w"}
    assert torch.equal(out["n"], torch.tensor(9))
    torch.testing.assert_close(out["w"], torch.tensor([2.0, 3.0]))


def test_first_sample_ignores_the_average_entirely():
    sample = {"w": torch.tensor([0.1, -2.5]), "n": torch.tensor(3)}
    first = swa_average({}, sample, num_averaged=0)  # no average exists yet
    assert torch.equal(first["w"], sample["w"]) and torch.equal(first["n"], sample["n"])
    assert first["w"] is not sample["w"]
    stale = {"w": torch.tensor([float("inf"), float("nan")]), "n": torch.tensor(0)}
    assert torch.equal(swa_average(stale, sample, 0)["w"], sample["w"])
