"""Shipped optimizer transforms checked with `functrain.testing`, as a user checks their own.

Every shipped optimizer is pure and deterministic without `donate`; a zero strength is the
identity (weight decay 0, momentum 0) or no step at all (learning rate 0); scalings commute;
torch's Adam puts its L2 term before the Adam scaling (the declared order, equal to `adam`); and a
run through `fit` killed and resumed from a checkpoint ends where the uninterrupted run ends.
(Named apart from tests/optim/test_optim_laws.py: test modules share one namespace.)
"""

import pytest

from functrain import optim
from functrain.testing import (
    LawError,
    check_commutes,
    check_determinism,
    check_identity_at_zero,
    check_order,
    check_purity,
    check_resume_equivalence,
)

OPTIMIZERS = {
    "sgd_momentum": lambda: optim.sgd(0.1, momentum=0.9, weight_decay=1e-3),
    "sgd_nesterov": lambda: optim.sgd(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: optim.adam(1e-2, weight_decay=1e-2),
    "adamw": lambda: optim.adamw(1e-2, amsgrad=True),
    "lion": lambda: optim.lion(1e-3, weight_decay=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_pure_and_deterministic(name):
    check_purity(OPTIMIZERS[name], steps=3)
    check_determinism(OPTIMIZERS[name], steps=3)


def test_zero_strength():
    check_identity_at_zero(optim.add_decayed_weights, strength="weight_decay")
    check_identity_at_zero(optim.trace, strength="decay", steps=3)
    # lr 0: every update is zero, as `scale(0)` (signed zeros compare equal)
    no_step = optim.scale(0.0)
    for factory in (optim.sgd, optim.adamw):
        check_identity_at_zero(
            factory, strength="lr", options={"momentum": 0.9} if factory is optim.sgd else {},
            reference=no_step, steps=3,
        )  # fmt: skip


def test_zero_momentum_is_plain_sgd():
    check_identity_at_zero(
        optim.sgd, strength="momentum", options={"lr": 0.1}, reference=optim.scale(-0.1), steps=3
    )


def test_scalings_commute_and_decay_does_not():
    check_commutes(optim.scale(2.0), optim.scale_by_learning_rate(0.1))
    with pytest.raises(LawError, match="law 'commutation'") as info:
        check_commutes(optim.add_decayed_weights(0.1), optim.scale(2.0))
    assert "leaf 0." in str(info.value) and "max abs difference" in str(info.value)


def test_adams_l2_term_comes_before_the_scaling():
    l2, rest = (
        optim.add_decayed_weights(0.1),
        optim.chain(optim.scale_by_adam(), optim.scale_by_learning_rate(1e-2)),
    )
    check_order(l2, rest)  # the order matters
    check_order(l2, rest, reference=optim.adam(1e-2, weight_decay=0.1), steps=3)
    with pytest.raises(LawError, match="law 'order'"):
        check_order(rest, l2, reference=optim.adam(1e-2, weight_decay=0.1))


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_resumes_exactly_through_fit(name):
    check_resume_equivalence(OPTIMIZERS[name])
