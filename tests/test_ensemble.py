"""Issue 28.1: a `TrainState` vmaps. `stack_states`/`unstack_states` build and split a stacked
state; a step from `make_step` runs under `torch.func.vmap(step, in_dims=(0, None))` as it is;
8 digits MLPs trained in one vmapped step equal 8 separate runs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain import optim
from functrain.tree import leaves_with_paths, tree_allclose


def mlp(seed, hidden=5, inputs=4, classes=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, classes)
    )


def ce(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def states_of(seeds, opt, **shape):
    return [functrain.init(mlp(s, **shape), opt, seed=0) for s in seeds]


@settings(max_examples=15, deadline=None)
@given(members=st.integers(1, 4), hidden=st.integers(1, 6), trained=st.integers(0, 2))
def test_unstack_of_stack_gives_the_members_back(members, hidden, trained):
    opt = optim.adamw(1e-2)
    states = states_of(range(members), opt, hidden=hidden)
    step = functrain.make_step(mlp(0, hidden=hidden), ce, opt)
    batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
    for _ in range(trained):  # members at one step with non-trivial moments and counters
        states = [step(s, batch)[0] for s in states]
    stacked = functrain.stack_states(states)
    assert stacked.params["0.weight"].shape == (members, hidden, 4)
    assert stacked.step == trained and stacked.timestamp == states[0].timestamp
    back = functrain.unstack_states(stacked)
    assert len(back) == members
    for a, b in zip(back, states):
        assert tree_allclose(a, b)
        assert a.params["0.weight"].data_ptr() != stacked.params["0.weight"].data_ptr()


def test_stacking_copies_and_unstacked_members_do_not_share_storage():
    opt = optim.sgd(0.1)
    states = states_of([0, 1], opt)
    stacked = functrain.stack_states(states)
    stacked.params["0.bias"].add_(1.0)
    assert not torch.equal(stacked.params["0.bias"][0], states[0].params["0.bias"])
    members = functrain.unstack_states(stacked)
    members[0].params["0.bias"].zero_()
    assert stacked.params["0.bias"][0].abs().sum() > 0


@pytest.mark.parametrize(
    "make_other, words",
    [
        (
            lambda opt: functrain.init(mlp(1, hidden=7), opt, seed=0),
            "'params.0.bias' is (5,) torch.float32 on cpu in member 0 but (7,)",
        ),
        (lambda opt: functrain.init(mlp(1), optim.sgd(0.1), seed=0), "another structure"),
        (lambda opt: functrain.init(mlp(1), opt, seed=3), "'rng.seed' is 0 in member 0 but 3"),
        (
            lambda opt: functrain.init(mlp(1), opt, seed=0).replace(step=4),
            "'step' is 0 in member 0 but 4 in member 1",
        ),
        (
            lambda opt: functrain.init(mlp(1).double(), opt, seed=0),
            "torch.float32 on cpu in member 0 but (5,) torch.float64",
        ),
    ],
)
def test_stacking_mismatched_members_names_the_difference(make_other, words):
    opt = optim.adamw(1e-3)
    with pytest.raises(ValueError) as error:
        functrain.stack_states([functrain.init(mlp(0), opt, seed=0), make_other(opt)])
    assert words in str(error.value)


def test_stack_and_unstack_refuse_what_they_cannot_split():
    with pytest.raises(ValueError, match="at least one TrainState"):
        functrain.stack_states([])
    with pytest.raises(TypeError, match="member 1 is dict"):
        functrain.stack_states([functrain.init(mlp(0), optim.sgd(0.1)), {}])
    with pytest.raises(TypeError, match="takes a TrainState"):
        functrain.unstack_states({"a": torch.zeros(2)})
    stacked = functrain.stack_states(states_of([0, 1], optim.sgd(0.1)))
    lopsided = stacked.replace(params={**stacked.params, "0.bias": torch.zeros(3, 5)})
    with pytest.raises(
        ValueError, match="'params.0.weight' has 2 members but 'params.0.bias' has 3"
    ):
        functrain.unstack_states(lopsided)
    scalar = stacked.replace(algo_state={"x": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="no member axis"):
        functrain.unstack_states(scalar)


def test_torch_pytree_sees_tensors_as_children_and_numbers_as_static():
    """What vmap flattens: tensors only. What a checkpoint stores: every leaf, by path, as
    before (the step and the counters stay Python numbers there)."""
    import torch.utils._pytree as pytree

    state = functrain.init(mlp(0), optim.adamw(1e-3), seed=2)
    children, spec = pytree.tree_flatten(state)
    assert all(isinstance(x, torch.Tensor) for x in children)
    assert len(children) == 12  # 4 params, mu and nu of each
    rebuilt = pytree.tree_unflatten(children, spec)
    assert tree_allclose(rebuilt, state) and rebuilt.rng.seed == 2
    paths = dict(leaves_with_paths(state))
    assert paths["step"] == 0 and paths["timestamp.batch"] == 0 and paths["rng.seed"] == 2
    assert paths["opt_state.0.count"] == 0
    keyed, _ = pytree.tree_flatten_with_path(state)
    assert [pytree.keystr(k) for k, _ in keyed][0] == "['params.0.bias']"


def test_a_vmapped_step_trains_each_member_as_its_own_step_would():
    opt = optim.adamw(1e-2)
    step = functrain.make_step(mlp(0), ce, opt)
    states = states_of(range(3), opt)
    batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
    stacked = functrain.stack_states(states)
    vstep = torch.func.vmap(step, in_dims=(0, None))
    for _ in range(3):
        stacked, metrics = vstep(stacked, batch)
        results = [step(s, batch) for s in states]
        states = [s for s, _ in results]
        losses = torch.stack([m["loss"] for _, m in results])
        assert torch.allclose(metrics["loss"], losses, atol=1e-6, rtol=0)
    assert stacked.step == 3 and stacked.timestamp.sample == 18
    assert stacked.opt_state[0].count == 3
    assert metrics["samples"].tolist() == [6, 6, 6]
    assert metrics["lr"].tolist() == pytest.approx([1e-2] * 3)
    for member, alone in zip(functrain.unstack_states(stacked), states):
        assert tree_allclose(member, alone, atol=1e-6)
    # The same step object still runs eagerly (donating or not) after its vmapped use.
    again, _ = step(states[0], batch)
    assert again.step == 4


@pytest.mark.parametrize(
    "algorithms, opt",
    [
        ([functrain.algorithms.label_smoothing(0.1)], optim.sgd(0.1, momentum=0.9)),
        ([functrain.algorithms.ema()], optim.adamw(1e-2)),
        ([functrain.algorithms.sam(rho=0.05)], optim.sgd(0.1)),
        ([], optim.chain(optim.clip_by_global_norm(0.5), optim.adamw(1e-2))),
    ],
    ids=["label_smoothing", "ema", "sam", "clip_by_global_norm"],
)
def test_a_composed_step_vmaps_too(algorithms, opt):
    step = functrain.compose(functrain.make_step(mlp(0), ce, opt), *algorithms)
    states = [step.init_state(s) for s in states_of([0, 1], opt)]
    batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    stacked = functrain.stack_states(states)
    for _ in range(3):
        stacked, _ = torch.func.vmap(step, in_dims=(0, None))(stacked, batch)
        states = [step(s, batch)[0] for s in states]
    for member, state in zip(functrain.unstack_states(stacked), states):
        assert tree_allclose(member, state, atol=1e-6)


def test_a_guarded_step_under_vmap_says_why_it_cannot():
    step = functrain.make_step(mlp(0), ce, optim.sgd(0.1), skip_nonfinite=True)
    stacked = functrain.stack_states(states_of([0, 1], optim.sgd(0.1)))
    batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    with pytest.raises(NotImplementedError, match="skip_nonfinite"):
        torch.func.vmap(step, in_dims=(0, None))(stacked, batch)


def test_eight_digits_mlps_in_one_vmapped_make_step_equal_eight_separate_runs():
    """The issue's demonstration through the public API: 8 MLPs on digits (each its own
    initialisation and its own minibatches), 5 steps of one vmapped `make_step` step with
    AdamW equal 8 separate runs of that step to 1e-6."""
    from bench import ensemble

    xs, ys = ensemble._data(8, 32)
    opt = optim.adamw(1e-2)
    models = [ensemble._model(i) for i in range(8)]
    step = functrain.make_step(models[0], ce, opt)
    separate = [functrain.init(m, opt, seed=0) for m in models]
    stacked = functrain.stack_states(separate)
    vstep = torch.func.vmap(step, in_dims=(0, 0))
    for _ in range(5):
        stacked, _ = vstep(stacked, (xs, ys))
        separate = [step(s, (xs[i], ys[i]))[0] for i, s in enumerate(separate)]
    assert not tree_allclose(separate[0].params, separate[1].params, atol=1e-3)
    members = functrain.unstack_states(stacked)
    for member, alone in zip(members, separate):
        assert member.step == alone.step == 5
        assert tree_allclose(member, alone, atol=1e-6, rtol=0)


def test_the_ensembles_page_runs():
    """docs/ensembles.md's example runs as written (its asserts included)."""
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "ensembles.md"
    (code,) = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    exec(compile(code, str(page), "exec"), {})


def test_a_model_with_dropout_vmaps_with_randomness_different_and_repeats():
    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)
        )

    step = functrain.make_step(model(0), ce, optim.sgd(0.1))
    stacked = functrain.stack_states([functrain.init(model(i), optim.sgd(0.1)) for i in (0, 1)])
    batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    vstep = torch.func.vmap(step, in_dims=(0, None), randomness="different")
    first, m1 = vstep(stacked, batch)
    again, m2 = vstep(stacked, batch)  # the draws are a function of the state (seed, step)
    assert torch.equal(m1["loss"], m2["loss"]) and tree_allclose(first, again)


def test_a_donating_step_under_vmap_leaves_the_stacked_input_untouched():
    """Under a transform the step never donates: vmap's inputs are not the step's to reuse."""
    opt = optim.adamw(1e-2)
    stacked = functrain.stack_states(states_of([0, 1], opt))
    before = functrain.tree.tree_clone(stacked)
    batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    pure = functrain.make_step(mlp(0), ce, opt)
    donating = functrain.make_step(mlp(0), ce, opt, donate=True)
    out, _ = torch.func.vmap(donating, in_dims=(0, None))(stacked, batch)
    assert tree_allclose(stacked, before)
    assert tree_allclose(out, torch.func.vmap(pure, in_dims=(0, None))(stacked, batch)[0])
