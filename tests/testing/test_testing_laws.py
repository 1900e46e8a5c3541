"""Each law checker passes a correct subject and catches a planted bug, with a readable error.

Algorithms are built from the step's pieces by hand here (as a user writes them); each planted
bug breaks exactly one law, and the `LawError` must name that law, a case, and (where two runs are
compared) the leaf that differs.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import EmptyState, Transform, scale
from functrain.rng import key_for
from functrain.step import Algorithm
from functrain.testing import (
    Case,
    LawError,
    cases,
    check_commutes,
    check_determinism,
    check_identity_at_zero,
    check_order,
    check_purity,
    check_resume_equivalence,
)


def on_inputs(name, fn):
    """An Algorithm whose prepare maps the inputs by `fn(x, state)`."""

    def apply(pieces):
        inner = pieces.prepare

        def prepare(state, batch):
            x, y = inner(state, batch)
            return fn(x, state), y

        return pieces._replace(prepare=prepare)

    return Algorithm(name=name, apply=apply)


def shift(amount):
    return on_inputs("shift", lambda x, state: x + amount)


def stretch(factor):
    return on_inputs("stretch", lambda x, state: x * factor)


def counter_in_place():
    """Keeps a step counter in algo_state, but bumps it in place (impure from step 2)."""

    def init(state):
        return torch.zeros(())

    def apply(pieces):
        inner = pieces.after_update

        def after_update(state):
            state = inner(state)
            state.algo_state["counter"].add_(1)
            return state

        return pieces._replace(after_update=after_update)

    return Algorithm(name="counter", apply=apply, init=init)


def test_purity_catches_an_in_place_state_update():
    with pytest.raises(LawError) as info:
        check_purity(counter_in_place())
    error = info.value
    assert error.law == "purity" and error.case == Case()
    assert "modified its input state" in str(error)
    assert "leaf algo_state.counter" in error.detail and "max abs difference 1" in error.detail


def test_purity_and_determinism_pass_a_correct_random_algorithm():
    def jitter(x, state):
        return x + 0.1 * torch.randn(x.shape, generator=key_for(state.rng, state.step, "jitter"))

    check_purity(on_inputs("jitter", jitter))
    check_determinism(on_inputs("jitter", jitter), varies_with_key=True)
    with pytest.raises(LawError, match="ignores the key"):
        check_determinism(shift(1.0), varies_with_key=True)  # deterministic: no key to use


def test_identity_at_zero_catches_a_floor_on_the_strength():
    check_identity_at_zero(shift, strength="amount")
    floored = lambda amount: shift(max(amount, 1e-3))  # noqa: E731
    with pytest.raises(LawError) as info:
        check_identity_at_zero(floored, strength="amount")
    assert info.value.law == "identity at zero strength"
    assert "expected: plain step, got: with the algorithm" in str(info.value)
    assert "leaf 0.params." in info.value.detail


def test_commutation_and_order_of_algorithms():
    check_commutes(stretch(2.0), stretch(4.0))  # powers of 2: exact in either order
    check_commutes(shift(1.0), shift(2.0), atol=1e-6)  # sums in another order: rounding
    with pytest.raises(LawError, match="law 'commutation'") as info:
        check_commutes(shift(1.0), stretch(2.0))
    assert "[shift, stretch]" in str(info.value)
    check_order(shift(1.0), stretch(2.0))  # the orders differ: the declared order matters
    check_order(shift(1.0), stretch(2.0), reference=[stretch(2.0), shift(2.0)])  # (x+1)*2
    with pytest.raises(LawError, match="gave the same result on all"):
        check_order(stretch(2.0), stretch(4.0))
    with pytest.raises(LawError, match="differs from the reference"):
        check_order(shift(1.0), stretch(2.0), reference=[stretch(2.0), shift(1.0)])


def test_resume_catches_state_kept_outside_the_train_state():
    def forgetful():
        seen = [0]  # a Python-side counter: a restarted process starts it again at 0

        def scaled(x, state):
            seen[0] += 1
            return x * (1.0 + 0.1 * seen[0])

        return on_inputs("forgetful", scaled)

    def remembering():  # the same, as a function of the state's step: resumes exactly
        return on_inputs("remembering", lambda x, state: x * (1.0 + 0.1 * (state.step + 1)))

    check_resume_equivalence(remembering)
    with pytest.raises(LawError) as info:
        check_resume_equivalence(forgetful)
    assert info.value.law == "resume equivalence"
    assert "resumed from the checkpoint at batch 2" in str(info.value)
    assert "leaf params." in info.value.detail
    with pytest.raises(ValueError, match="resumable=False"):
        check_resume_equivalence(remembering()._replace(resumable=False))


def add_l2(strength, in_place=False, noisy=False):
    def update(grads, state, params=None, **extra):
        out = {}
        for k, g in grads.items():
            term = strength * params[k]
            if noisy:
                term = term + 1e-3 * torch.randn(g.shape)  # torch's global generator
            out[k] = g.add_(term) if in_place else g + term
        return out, state

    return Transform(lambda params: EmptyState(), update)


def test_transform_laws_and_their_bugs():
    check_purity(add_l2(0.1))
    check_determinism(add_l2(0.1))
    check_identity_at_zero(add_l2, strength="strength")
    check_commutes(add_l2(0.1), add_l2(0.2), atol=1e-6)  # sums in another order: rounding
    with pytest.raises(LawError, match="modified its input grads"):
        check_purity(add_l2(0.1, in_place=True))
    with pytest.raises(LawError, match="law 'determinism'"):
        check_determinism(add_l2(0.1, noisy=True))
    with pytest.raises(LawError, match="law 'identity at zero strength'"):
        check_identity_at_zero(add_l2, strength="strength", zero=0.5)
    with pytest.raises(LawError, match="law 'commutation'"):
        check_commutes(add_l2(0.1), scale(2.0))


def test_a_law_broken_only_on_some_cases_is_shrunk_to_a_minimal_one():
    def mutates_big_batches(x, state):
        return x.mul_(2.0) if x.shape[0] >= 5 else x * 2.0

    with pytest.raises(LawError) as info:
        check_purity(
            on_inputs("big", mutates_big_batches),
            steps=1,
            cases=cases(kinds=("mlp",), max_features=2, max_hidden=2, max_classes=2, max_seed=2),
            settings=settings(max_examples=30, derandomize=True, database=None, deadline=None),
        )
    assert info.value.case == Case(
        kind="mlp", features=1, size=2, hidden=1, classes=2, batch_size=5, seed=0
    )
    assert "Case(mlp 1->1->2, batch 5, seed 0)" in str(info.value)


def test_one_explicit_case():
    check_purity(shift(1.0), case=Case(kind="cnn", batch_size=3, seed=5))
    with pytest.raises(LawError, match=r"Case\(cnn 2x3x3->4->2, batch 3, seed 5\)"):
        check_purity(
            on_inputs("bad", lambda x, state: x.mul_(2.0)),
            case=Case(kind="cnn", features=2, size=3, hidden=4, classes=2, batch_size=3, seed=5),
        )


@settings(max_examples=5, deadline=None)
@given(case=cases(), amount=st.floats(-2.0, 2.0))
def test_inside_a_given_test_the_case_is_passed_in(case, amount):
    check_purity(shift(amount), case=case)
    check_identity_at_zero(shift, strength="amount", case=case)


def test_argument_errors_say_what_to_pass():
    with pytest.raises(TypeError, match="Algorithm or a Transform"):
        check_purity(42)
    with pytest.raises(TypeError, match="returned int"):
        check_purity(lambda: 42)
    with pytest.raises(TypeError, match="name of the argument"):
        check_identity_at_zero(shift, strength=0)
    with pytest.raises(TypeError, match="two Algorithms or two Transforms"):
        check_commutes(shift(1.0), scale(2.0))
    with pytest.raises(ValueError, match="steps must be"):
        check_purity(shift(1.0), steps=0)
    with pytest.raises(ValueError, match="a Transform takes no key"):
        check_determinism(scale(2.0), varies_with_key=True)
    with pytest.raises(ValueError, match="steps must be an int >= 4"):
        check_resume_equivalence(shift(1.0), steps=2)
