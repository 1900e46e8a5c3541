"""Nonsense hyperparameters are refused when the optimizer is built, with a message (13.9)."""

from __future__ import annotations

import math

import pytest
import torch

from functrain import optim
from functrain.units import Timestamp

FACTORIES = {
    "sgd": optim.sgd,
    "adam": optim.adam,
    "adamw": optim.adamw,
    "decoupled_sgdw": optim.decoupled_sgdw,
    "decoupled_adamw": optim.decoupled_adamw,
    "lion": optim.lion,
    "scale_by_learning_rate": optim.scale_by_learning_rate,
}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_non_finite_learning_rate_is_refused(name, value):
    with pytest.raises(ValueError, match=r"invalid lr=.*finite"):
        FACTORIES[name](value)


@pytest.mark.parametrize(
    "build",
    [
        lambda: optim.adamw(1e-3, weight_decay=math.nan),
        lambda: optim.adamw(1e-3, betas=(math.nan, 0.999)),
        lambda: optim.adam(1e-3, eps=math.inf),
        lambda: optim.sgd(0.1, momentum=math.nan),
        lambda: optim.clip_by_global_norm(math.nan),
        lambda: optim.clip_by_value(min=math.nan),
        lambda: optim.scale(math.nan),
        lambda: optim.decoupled_adamw(1e-3, initial_lr=math.inf),
    ],
    ids=["weight_decay", "beta1", "eps", "momentum", "max_norm", "clip min", "scale", "initial_lr"],
)
def test_every_non_finite_hyperparameter_is_refused(build):
    with pytest.raises(ValueError, match="finite"):
        build()


def test_booleans_and_strings_are_not_numbers():
    with pytest.raises(TypeError, match="lr must be a number or a schedule"):
        optim.adamw(True)
    with pytest.raises(TypeError, match="weight_decay must be a number"):
        optim.adamw(1e-3, weight_decay="0.1")


def test_a_schedule_that_gives_nan_fails_at_its_step_naming_it():
    opt = optim.sgd(lambda t: math.nan if getattr(t, "batch", t) >= 1 else 0.1)
    params = {"w": torch.zeros(2)}
    state = opt.init(params)
    grads = {"w": torch.ones(2)}
    _, state = opt.update(grads, state, params, time=Timestamp(batch=0))
    with pytest.raises(ValueError, match="schedule of lr gave nan at batch 1"):
        opt.update(grads, state, params, time=Timestamp(batch=1))
