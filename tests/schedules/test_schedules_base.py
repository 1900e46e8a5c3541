"""Schedule base: how time is measured, absolute (Scaled) schedules, config, argument checks."""

import dataclasses
import doctest
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import ref_cos, schedule_and_reference

from functrain import schedules as S
from functrain.schedules import base
from functrain.units import Time, Timestamp

# ---- units and horizons ------------------------------------------------------------------------


def test_epochs_and_dur_resolve_through_the_horizon():
    ts = Timestamp(batch=25, batches_per_epoch=10, max_batches=100)
    assert S.step("1ep", gamma=0.5)(ts) == 0.25
    assert S.linear(t_max="1dur")(ts) == 0.75
    assert S.cosine_annealing_with_warmup("1ep", t_max="0.5dur")(ts) == pytest.approx(
        ref_cos((25 - 10) / (50 - 10), 0.0)
    )
    # "0.3dur" of 100 batches is 30.000000000000004 in floats; batch 30 still reaches it.
    assert S.multistep(["0.3dur"], gamma=0.5)(ts.replace(batch=30)) == 0.5
    assert S.constant(0.5, "0.3dur")(ts.replace(batch=30)) == 1.0


def test_unknown_horizon_is_a_clear_error():
    with pytest.raises(ValueError, match="max_batches is unknown.*duration="):
        S.cosine_annealing()(10)
    with pytest.raises(ValueError, match="batches_per_epoch is unknown"):
        S.step("1ep")(Timestamp(batch=3))
    with pytest.raises(ValueError, match=r"CosineAnnealingSchedule\(.*\) at batch 10"):
        S.cosine_annealing()(10)


def test_samples_and_tokens_use_their_own_counters():
    ts = Timestamp(batch=4, sample=96, token=0)
    assert S.linear(t_max="192sp")(ts) == 0.5
    with pytest.raises(ValueError, match="none were counted in 4 batches.*count_tokens"):
        S.linear_with_warmup("1000tok", t_max="2000tok")(ts)


@pytest.mark.parametrize("bad", [-1, math.nan, "10ba", None, True])
def test_bad_times_are_refused(bad):
    with pytest.raises((ValueError, TypeError), match="schedule"):
        S.linear(t_max="10ba")(bad)


def test_counts_may_be_numpy_or_0d_tensors():
    s = S.linear_with_warmup("2ba", t_max="10ba")
    assert s(torch.tensor(5)) == s(np.int64(5)) == s(5.0) == s(5)


# ---- multiplying into absolute values ----------------------------------------------------------


def test_number_times_schedule_is_an_absolute_schedule():
    s = S.cosine_annealing_with_warmup("10ba", t_max="110ba")
    for lr in (1e-3 * s, s * 1e-3):
        assert isinstance(lr, S.Scaled) and lr == S.Scaled(s, 1e-3)
        assert [lr(t) for t in (0, 5, 60, 110)] == pytest.approx(
            [1e-3 * s(t) for t in (0, 5, 60, 110)]
        )
    assert 2 * (3 * s) == S.Scaled(s, 6.0)
    with pytest.raises(TypeError):
        s * s
    with pytest.raises(TypeError):
        "3" * s
    plain = S.Scaled(lambda ts: ts.batch / 10, 0.5)  # any callable of a timestamp
    assert plain(4) == 0.2


# ---- plain data --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(schedule_and_reference(), st.floats(1e-6, 1.0))
def test_config_round_trips_through_json(pair, factor):
    schedule, _ = pair
    for s in (schedule, factor * schedule):
        config = json.loads(json.dumps(s.to_config()))
        rebuilt = S.from_config(config)
        assert rebuilt == s and hash(rebuilt) == hash(s)
        assert rebuilt(37) == s(37)


def test_schedules_are_frozen_data():
    s = S.multistep(["1ep", "2ep"])
    assert s.milestones == (Time(1, "ep"), Time(2, "ep"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.gamma = 0.5
    assert {s: 1}[S.multistep(("1ep", "2ep"))] == 1


def test_config_errors():
    with pytest.raises(ValueError, match="unknown schedule 'cosine'.*cosine_annealing"):
        S.from_config({"name": "cosine"})
    with pytest.raises(TypeError, match="bad config for schedule 'linear'"):
        S.from_config({"name": "linear", "t_maximum": "1dur"})
    with pytest.raises(TypeError, match="a dict with a 'name'"):
        S.from_config(["linear"])
    with pytest.raises(TypeError, match="Schedule subclass"):
        S.Scaled(lambda t: 1.0, 2.0).to_config()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: S.step("0ba"), "positive length"),
        (lambda: S.cosine_annealing(t_max="30sec"), "wall-clock"),
        (lambda: S.linear_with_warmup("1h"), "wall-clock"),
        (lambda: S.multistep("10ba"), "list of times"),
        (lambda: S.exponential(0.0), "gamma must be >"),
        (lambda: S.step("10ba", gamma=-0.1), "gamma must be >="),
        (lambda: S.polynomial(-1.0), "power must be >="),
        (lambda: S.cosine_annealing_warm_restarts("10ba", t_mult=0), "t_mult must be >"),
        (lambda: S.cosine_annealing_with_warmup("1ba", scale_warmup=1), "scale_warmup"),
        (lambda: S.linear(alpha_i=math.inf), "alpha_i must be a finite"),
        (lambda: S.linear(t_max="ten batches"), "accepted forms"),
    ],
)
def test_bad_arguments_name_the_problem(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


# ---- the package -------------------------------------------------------------------------------


def test_package_reexports_every_public_name():
    # Each name lives in exactly one submodule and the package re-exports exactly those.
    import importlib

    from functrain.schedules import decay, scaling, warmup

    one_cycle = importlib.import_module("functrain.schedules.one_cycle")  # the name is a class
    modules = (base, decay, warmup, scaling, one_cycle)
    parts = [m.__all__ for m in modules]
    names = [n for part in parts for n in part]
    assert len(names) == len(set(names)) and set(names) == set(S.__all__)
    assert all(getattr(S, n) is getattr(m, n) for m in modules for n in m.__all__)
    assert S.cosine_annealing_with_warmup is S.CosineAnnealingWithWarmupSchedule


def test_docstring_examples_run():
    assert doctest.testmod(S).failed == 0
    assert doctest.testmod(base).failed == 0


def test_a_config_without_a_name_is_a_type_error_naming_it():
    """Found by `python -m bench mutants` (issue 17): the check was untested."""
    from functrain.schedules import from_config

    with pytest.raises(TypeError, match="a dict with a 'name'"):
        from_config({"t_max": "10ba"})
    with pytest.raises(TypeError, match="a dict with a 'name'"):
        from_config(["name"])


def test_scaling_by_a_non_number_defers_to_the_other_operand():
    """`Scaled * x` returns NotImplemented for non-numbers, so `x.__rmul__` answers (found by
    `python -m bench mutants`: `or` -> `and` in the check survived)."""
    from functrain.schedules import Scaled, cosine_annealing

    class Knows:
        def __rmul__(self, other):
            return ("rmul", other)

    scaled = Scaled(cosine_annealing(), 2.0)
    assert scaled * Knows() == ("rmul", scaled)
    with pytest.raises(TypeError):
        scaled * "2"


def test_a_schedule_takes_a_0d_tensor_count_but_not_a_1d_one():
    s = S.linear(alpha_i=1.0, alpha_f=0.0, t_max="10ba")
    assert s(torch.tensor(5)) == 0.5  # a count restored from a checkpoint
    with pytest.raises(TypeError, match="Timestamp or a number of batches"):
        s(torch.tensor([5]))  # one element, but a list of counts, not a count


def test_zero_length_times_are_allowed_where_a_field_is_not_a_period():
    assert base._schedule_time("0ba", "t_max") == Time(0, "ba")
    with pytest.raises(ValueError, match="positive length"):
        base._schedule_time("0ba", "t_max", positive=True)
    # active for no time at all: 1.0 from the first batch
    assert S.constant(alpha=0.5, t_max="0ba")(0) == 1.0


def test_sample_time_with_no_samples_counted_fails_from_the_first_batch():
    s = S.linear(alpha_i=1.0, alpha_f=0.0, t_max="100sp")
    assert s(Timestamp(batch=0)) == 1.0  # nothing trained yet: fine
    with pytest.raises(ValueError, match="none were counted in 1 batches"):
        s(Timestamp(batch=1))  # one batch done, zero samples counted: a frozen schedule


def test_count_slack_is_relative_and_tiny():
    # a float just short of a whole period by more than the slack (1e-12) is not rounded up
    assert base._count(1.0 - 1.5e-12, 1.0) == 0
    assert base._count(1.0 - 0.5e-12, 1.0) == 1
    assert base._count(3.0, 1.0) == 3


def test_a_schedule_without_at_cannot_be_made():
    class NoAt(base.Schedule):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoAt()
