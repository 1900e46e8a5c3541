"""inject_hyperparams: values in state, schedules read extra["time"]; current_lr."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import (
    InjectHyperparamsState,
    adamw,
    chain,
    clip_by_global_norm,
    current_lr,
    decoupled_adamw,
    inject_hyperparams,
    masked,
    multi_steps,
    sgd,
)
from functrain.tree import leaves_with_paths
from functrain.units import Timestamp


def _batches(t):
    return t.batch if isinstance(t, Timestamp) else t


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(0, 10_000), calls=st.integers(1, 3))
def test_schedule_uses_extra_time_when_given(batch, calls):
    def schedule(t):
        return 1.0 / (1 + _batches(t))

    opt = inject_hyperparams(sgd)(lr=schedule)
    params = {"w": torch.zeros(2)}
    state = opt.init(params)
    for _ in range(calls):
        updates, state = opt.update(
            {"w": torch.ones(2)}, state, params, time=Timestamp(batch=batch)
        )
    assert state.hyperparams["lr"] == schedule(batch)
    assert current_lr(state) == schedule(batch)
    assert torch.allclose(updates["w"], torch.full((2,), -schedule(batch)))
    assert state.count == calls


def test_schedule_falls_back_to_own_count():
    opt = inject_hyperparams(sgd)(lr=lambda t: 0.1 * (t + 1), momentum=0.9)
    params = {"w": torch.zeros(1)}
    state = opt.init(params)
    assert current_lr(state) == pytest.approx(0.1)  # value at t=0 before any update
    used = []
    for _ in range(3):
        _, state = opt.update({"w": torch.ones(1)}, state, params)
        used.append(current_lr(state))
    assert used == pytest.approx([0.1, 0.2, 0.3])
    assert state.hyperparams["momentum"] == 0.9


def test_injected_equals_plain_and_state_is_checkpointable(random_tree):
    params = random_tree(0)
    plain = adamw(1e-2, betas=(0.9, 0.99))
    injected = inject_hyperparams(adamw)(lr=1e-2, betas=(0.9, 0.99))
    s1, s2 = plain.init(params), injected.init(params)
    for seed in range(1, 4):
        g = random_tree(seed)
        u1, s1 = plain.update(g, s1, params)
        u2, s2 = injected.update(g, s2, params)
        assert all(torch.equal(u1[k], u2[k]) for k in u1)
    assert isinstance(s2, InjectHyperparamsState)
    for path, leaf in leaves_with_paths(s2):  # only tensors and plain numbers
        assert isinstance(leaf, (torch.Tensor, int, float)), path
    assert "hyperparams.lr" in dict(leaves_with_paths(s2))


def test_static_args_and_structure_change_error():
    params = {"w": torch.zeros(2)}
    acc = inject_hyperparams(multi_steps, static_args=("inner", "every_k"))(
        inner=sgd(0.1), every_k=2
    )
    acc.update({"w": torch.ones(2)}, acc.init(params), params)
    flip = inject_hyperparams(sgd)(lr=0.1, momentum=lambda t: 0.9 if t else 0.0)
    state = flip.init(params)
    _, state = flip.update({"w": torch.ones(2)}, state, params)
    with pytest.raises(ValueError, match="structure"):
        flip.update({"w": torch.ones(2)}, state, params)


def test_decoupled_adamw_injected_needs_initial_lr():
    params = {"w": torch.ones(1, dtype=torch.float64)}
    zero = {"w": torch.zeros(1, dtype=torch.float64)}
    opt = inject_hyperparams(decoupled_adamw)(
        lr=lambda t: 0.5e-3, initial_lr=1e-3, weight_decay=0.1
    )
    updates, _ = opt.update(zero, opt.init(params), params)
    # lr_t / initial_lr = 0.5, so the decay is 0.1 * 0.5.
    assert torch.allclose(params["w"] + updates["w"], torch.tensor([0.95], dtype=torch.float64))


def test_current_lr_finds_nested_and_absent():
    params = {"w": torch.zeros(2)}
    assert current_lr(sgd(0.3).init(params)) == 0.3
    nested = chain(clip_by_global_norm(1.0), masked(multi_steps(adamw(2e-3), 2), {"w": True}))
    assert current_lr(nested.init(params)) == 2e-3
    assert current_lr(clip_by_global_norm(1.0).init(params)) is None
    # A parameter named "lr" is not mistaken for a learning rate.
    assert current_lr(chain(clip_by_global_norm(1.0)).init({"lr": torch.zeros(1)})) is None


def test_schedules_in_epoch_and_duration_units_initialise_without_a_horizon():
    # init runs before fit knows the run's length; the value at time 0 needs no horizon.
    from functrain import schedules
    from functrain.optim import adamw, inject_hyperparams
    from functrain.units import Timestamp

    params = {"w": torch.zeros(2)}
    lr = 1e-3 * schedules.cosine_annealing_with_warmup(t_warmup="1ep", t_max="1dur")
    opt = adamw(lr=lr)
    state = opt.init(params)
    assert current_lr(state) == 0.0
    _, state = opt.update(
        {"w": torch.ones(2)},
        state,
        params,
        time=Timestamp(batch=5, batches_per_epoch=10, max_batches=100),
    )
    assert current_lr(state) == pytest.approx(0.5e-3)
    injected = inject_hyperparams(adamw)(lr=1e-3 * schedules.cosine_annealing(t_max="1dur"))
    assert current_lr(injected.init(params)) == pytest.approx(1e-3)


def test_a_mask_function_is_passed_as_is_and_other_callables_are_schedules():
    from functrain.optim import adamw, clip_by_global_norm, inject_hyperparams, no_decay_mask

    params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
    opt = inject_hyperparams(adamw)(
        lr=lambda t: 0.1, weight_decay=0.5, weight_decay_mask=no_decay_mask
    )
    state = opt.init(params)
    assert set(state.hyperparams) == {"lr", "weight_decay"}  # the mask is not a hyperparameter
    grads = {k: torch.zeros_like(v) for k, v in params.items()}
    updates, _ = opt.update(grads, state, params)
    assert torch.allclose(updates["w"], -0.1 * 0.5 * params["w"])  # decayed
    assert torch.equal(updates["b"], torch.zeros(2))  # masked out: no decay
    clip = inject_hyperparams(clip_by_global_norm)(max_norm=lambda t: 2.0)
    assert clip.init(params).hyperparams == {"max_norm": 2.0}


def _own_transform(copies, fail=None):
    """A user's transform whose state has `copies` tensors (the structure follows the value) and
    whose update raises `fail` if given."""
    from functrain.optim import Transform

    def init(params):
        return tuple(torch.zeros(1) for _ in range(int(copies)))

    def update(grads, state, params=None, **extra):
        if fail is not None:
            raise fail
        return grads, tuple(torch.zeros(1) for _ in range(int(copies)))

    return Transform(init, update)


def test_an_update_that_changes_the_state_structure_without_failing_is_refused():
    params = {"w": torch.zeros(2)}
    grow = inject_hyperparams(_own_transform)(copies=lambda t: 1.0 if t == 0 else 2.0)
    _, state = grow.update({"w": torch.ones(2)}, grow.init(params), params)  # count 0: 1 copy
    with pytest.raises(ValueError, match="change the optimizer state's structure"):
        grow.update({"w": torch.ones(2)}, state, params)


def test_an_update_error_with_an_unchanged_structure_is_raised_as_is():
    params = {"w": torch.zeros(2)}
    failing = inject_hyperparams(_own_transform, static_args=("fail",))(
        copies=1.0, fail=ValueError("the transform's own complaint")
    )
    with pytest.raises(ValueError, match="the transform's own complaint"):
        failing.update({"w": torch.ones(2)}, failing.init(params), params)


def test_a_mask_argument_without_a_default_is_passed_as_is():
    # masked's `mask` has no default: a callable there is still a mask, not a schedule.
    params = {"w": torch.ones(2), "b": torch.ones(2)}
    opt = inject_hyperparams(masked, static_args=("inner",))(
        inner=sgd(0.1), mask=lambda tree: {k: k == "w" for k in tree}
    )
    state = opt.init(params)
    assert "mask" not in state.hyperparams
    updates, _ = opt.update(params, state, params)
    assert torch.allclose(updates["w"], torch.full((2,), -0.1))
    assert torch.equal(updates["b"], torch.zeros(2))


def test_current_lr_reads_an_injected_learning_rate_the_inner_state_does_not_keep():
    def own_sgd(learning_rate):  # a scale: its state records no learning rate
        from functrain.optim import scale

        return scale(-learning_rate)

    params = {"w": torch.zeros(2)}
    opt = inject_hyperparams(own_sgd)(learning_rate=lambda t: 0.25)
    assert current_lr(opt.init(params)) == 0.25
