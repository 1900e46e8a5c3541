"""Schedules in epoch and duration units, through `fit`, for every optimizer (issue 11.3): the
learning rate and the weight decay of each step against values computed by hand.

The gradient is zero (the loss does not depend on the weights), so each step only decays the
weights: `w <- w * (1 - d_t)`, with `d_t` the optimizer's decay at step t (for all of them the
gradient part is exactly 0: SGD's `lr * 0`, Adam's `0 / (0 + eps)`, Lion's `sign(0)`).
"""

from __future__ import annotations

import math

import pytest
import torch

import functrain
from functrain import optim, schedules

BATCHES_PER_EPOCH, EPOCHS = 4, 3
TOTAL = BATCHES_PER_EPOCH * EPOCHS
BASE, WD = 0.1, 0.05


def multiplier(t: int, warmup: float) -> float:
    """Composer's cosine with warm-up, by hand: t / warmup, then a cosine to 0 at TOTAL."""
    if t < warmup:
        return t / warmup
    return 0.5 * (1 + math.cos(math.pi * (t - warmup) / (TOTAL - warmup)))


WARMUPS = {"1ep": BATCHES_PER_EPOCH, "0.1dur": 0.1 * TOTAL}

# name -> (make(lr), the decay d_t of one step given lr_t). The lr is BASE * schedule.
OPTIMIZERS = {
    "decoupled_sgdw": (
        lambda lr: optim.decoupled_sgdw(lr, momentum=0.9, weight_decay=WD),
        lambda lr_t: WD * lr_t / BASE,
    ),
    "decoupled_adamw": (
        lambda lr: optim.decoupled_adamw(lr, weight_decay=WD),
        lambda lr_t: WD * lr_t / BASE,
    ),
    "inject_hyperparams(decoupled_adamw)": (
        lambda lr: optim.inject_hyperparams(optim.decoupled_adamw)(lr=lr, weight_decay=WD),
        lambda lr_t: WD * lr_t / BASE,
    ),
    "sgd": (lambda lr: optim.sgd(lr, weight_decay=WD), lambda lr_t: lr_t * WD),
    "adamw": (lambda lr: optim.adamw(lr, weight_decay=WD), lambda lr_t: lr_t * WD),
    "lion": (lambda lr: optim.lion(lr, weight_decay=WD), lambda lr_t: lr_t * WD),
    "clip+adamw": (
        lambda lr: optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(lr, weight_decay=WD)),
        lambda lr_t: lr_t * WD,
    ),
}


class Record:
    def __init__(self):
        self.lrs, self.weights = [], []

    def batch_end(self, ctx):
        self.lrs.append(ctx.metrics["lr"])
        self.weights.append(ctx.state.params["weight"].detach().clone())


def zero_gradient_loss(model, batch):
    return (model(batch) * 0.0).sum()


@pytest.mark.parametrize("donate", [True, False], ids=["fit", "fit(donate=False)"])
@pytest.mark.parametrize("warmup", sorted(WARMUPS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_epoch_and_duration_warmups_resolve_in_fit(name, warmup, donate):
    make, decay = OPTIMIZERS[name]
    sched = schedules.cosine_annealing_with_warmup(t_warmup=warmup)
    opt = make(BASE * sched)
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0, 4.0]]))
    state = functrain.init(model, opt, seed=0)  # the horizon is unknown here: must not fail
    step = functrain.make_step(model, zero_gradient_loss, opt)
    data = [torch.ones(2, 3)] * BATCHES_PER_EPOCH
    record = Record()
    functrain.fit(
        step,
        state,
        data,
        duration=f"{EPOCHS}ep",
        callbacks=[record],
        log_interval=None,
        eval_interval=None,
        donate=donate,
    )
    expected_lrs = [BASE * multiplier(t, WARMUPS[warmup]) for t in range(TOTAL)]
    assert record.lrs == pytest.approx(expected_lrs, rel=1e-9, abs=1e-12)
    weight = torch.tensor([[1.0, -2.0, 4.0]], dtype=torch.float64)
    for t, observed in enumerate(record.weights):
        weight = weight * (1 - decay(expected_lrs[t]))
        torch.testing.assert_close(observed.double(), weight, rtol=2e-6, atol=1e-7)


def test_decoupled_optimizers_read_the_base_from_the_schedule():
    sched = 0.1 * schedules.cosine_annealing_with_warmup("1ep")
    for make in (optim.decoupled_adamw, optim.decoupled_sgdw):
        spec = make(sched, weight_decay=1e-2).spec
        decay = spec.parts[-1]
        assert decay.base == pytest.approx(0.1)
        assert make(schedules.constant(), weight_decay=1e-2).spec.parts[-1].base == 1.0
        with pytest.raises(ValueError, match="initial_lr=.*base \\* schedule"):
            make(lambda t: 0.1, weight_decay=1e-2)
        assert make(lambda t: 0.1, weight_decay=1e-2, initial_lr=0.2).spec.parts[-1].base == 0.2
    with pytest.raises(ValueError, match="initial_lr="):
        optim.inject_hyperparams(optim.decoupled_adamw)(lr=lambda t: 1e-3)
