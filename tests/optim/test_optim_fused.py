"""The fused executor: every documented composition keeps the fast path (structural, by counting
the kernels that run), and gives the reference foreach path's results (hypothesis)."""

from __future__ import annotations

import collections
import weakref

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import functrain
from functrain import optim, schedules
from functrain.optim.fused_groups import dense
from functrain.tree import tree_allclose, tree_clone, tree_flatten
from functrain.units import Timestamp

COSINE = 1e-2 * schedules.cosine_annealing_with_warmup("2ba", t_max="20ba")

# name -> (optimizer factory, the kernel its update must run). The documented combinations: the
# optimizers' docstrings, the package docstring, the README.
DOCUMENTED = {
    "adamw": (lambda: optim.adamw(1e-2), "_fused_adamw_"),
    "adam": (lambda: optim.adam(1e-2, weight_decay=0.1), "_fused_adam_"),
    "amsgrad": (lambda: optim.adamw(1e-2, amsgrad=True), "_fused_adamw_"),
    "chain(clip, adamw)": (
        lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-3)),
        "_fused_adamw_",
    ),
    "chain(clip, adamw masked, cosine)": (
        lambda: optim.chain(
            optim.clip_by_global_norm(1.0),
            optim.adamw(COSINE, weight_decay=0.1, weight_decay_mask=optim.no_decay_mask),
        ),
        "_fused_adamw_",
    ),
    "inject_hyperparams(adamw)": (
        lambda: optim.inject_hyperparams(optim.adamw)(lr=COSINE, weight_decay=0.05),
        "_fused_adamw_",
    ),
    "decoupled_adamw": (lambda: optim.decoupled_adamw(COSINE, weight_decay=1e-2), "_fused_adamw_"),
    "inject_hyperparams(decoupled_adamw)": (
        lambda: optim.inject_hyperparams(optim.decoupled_adamw)(lr=COSINE, weight_decay=1e-2),
        "_fused_adamw_",
    ),
    "sgd": (lambda: optim.sgd(0.1), "_fused_sgd_"),
    "sgd momentum": (
        lambda: optim.sgd(
            0.1, momentum=0.9, weight_decay=5e-4, weight_decay_mask=optim.no_decay_mask
        ),
        "_fused_sgd_",
    ),
    "sgd nesterov, clipped": (
        lambda: optim.chain(
            optim.clip_by_global_norm(1.0), optim.sgd(COSINE, momentum=0.9, nesterov=True)
        ),
        "_fused_sgd_",
    ),
    "decoupled_sgdw": (
        lambda: optim.decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-5),
        "_fused_sgd_",
    ),
    "lion": (lambda: optim.lion(1e-4, weight_decay=1.0), "_foreach_sign_"),
    "masked(adamw)": (
        lambda: optim.masked(optim.adamw(1e-3), lambda p: {k: k.startswith("2.") for k in p}),
        "_fused_adamw_",
    ),
}

# The foreach math of the reference path: none of it may run on the fast path (Lion has no torch
# kernel, so its five in-place passes are its fast path).
REFERENCE_MATH = {
    "_foreach_lerp",
    "_foreach_lerp_",
    "_foreach_addcmul_",
    "_foreach_addcdiv_",
    "_foreach_sqrt",
    "_foreach_div",
    "_foreach_div_",
    "_foreach_mul",
    "_foreach_add",
    "_foreach_maximum",
}
FUSED_KERNELS = {"_fused_adam_", "_fused_adamw_", "_fused_sgd_"}


class OpCounter(TorchDispatchMode):
    """Counts every aten op that runs under it, by its overload packet's name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def batches(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_combination_has_a_fused_plan(name):
    make, kernel = DOCUMENTED[name]
    params = dict(make_model().named_parameters())
    plan = optim.fused_plan(make(), params)
    assert plan is not None, optim.why_not_fused(make(), params)
    assert plan.kernel == kernel or (kernel == "_foreach_sign_" and plan.kernel.startswith("lion"))


@pytest.mark.parametrize("donate", [False, True], ids=["pure", "donated"])
@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_combination_runs_the_fused_kernel_inside_the_step(name, donate):
    make, kernel = DOCUMENTED[name]
    opt, model = make(), make_model()
    step = functrain.make_step(model, loss_fn, opt, donate=donate)
    state = functrain.init(model, opt, seed=0)
    for batch in batches(2):  # the second step is the steady state (buffers recycled)
        with OpCounter() as counter:
            state, _ = step(state, batch)
    ops = counter.ops
    assert ops[kernel] >= 1, f"{name}: {kernel} did not run; ops: {dict(ops)}"
    if kernel in FUSED_KERNELS:
        assert not (REFERENCE_MATH & set(ops)), f"{name} ran the reference math: {dict(ops)}"
    assert ops[kernel] <= 2  # one call per parameter group (decayed or not)


def test_a_composition_without_a_fused_form_says_why_and_falls_back_untouched():
    opt = optim.chain(optim.clip_by_value(0.5), optim.adamw(1e-2))
    params = dict(make_model().named_parameters())
    assert optim.fused_plan(opt, params) is None
    assert "spec" in optim.why_not_fused(opt, params)
    plain = {k: v.detach().clone() for k, v in params.items()}
    state = opt.init(plain)
    before = tree_clone((plain, state))
    grads = {k: torch.ones_like(v) for k, v in plain.items()}
    assert optim.fused_update(opt, grads, state, plain) is None
    assert tree_allclose((plain, state), before, atol=0)


def test_the_plan_names_its_groups_and_folded_clip():
    opt, _ = DOCUMENTED["chain(clip, adamw masked, cosine)"]
    params = dict(make_model().named_parameters())
    plan = optim.fused_plan(opt(), params)
    assert (plan.groups, plan.decayed, plan.tensors, plan.clip) == (2, 2, 4, True)
    assert (
        str(plan) == "_fused_adamw_ x2 groups (decay on 2 of 4 tensors), global-norm clip folded in"
    )


# -- equal to the reference path, for every composition -----------------------------------------


@st.composite
def compositions(draw):
    """A random optimizer in the recognised form: family, decay and mask, schedule, clip,
    inject_hyperparams, a masked optimizer on top."""
    family = draw(
        st.sampled_from(["adam", "adamw", "decoupled_adamw", "sgd", "decoupled_sgdw", "lion"])
    )
    wd = draw(st.sampled_from([0.0, 0.05]))
    mask = optim.no_decay_mask if draw(st.booleans()) else None
    scheduled = draw(st.booleans())
    lr = {"lion": 1e-3, "sgd": 0.1, "decoupled_sgdw": 0.1}.get(family, 1e-2)
    lr_value = lr * schedules.linear_with_warmup("2ba", t_max="10ba") if scheduled else lr
    kwargs = {"weight_decay": wd, "weight_decay_mask": mask}
    if family in ("sgd", "decoupled_sgdw"):
        momentum = draw(st.sampled_from([0.0, 0.9]))
        kwargs["momentum"] = momentum
        kwargs["nesterov"] = momentum > 0 and draw(st.booleans())
        if not kwargs["nesterov"] and momentum:
            kwargs["dampening"] = draw(st.sampled_from([0.0, 0.1]))
    if family == "adam" or family == "adamw":
        kwargs["amsgrad"] = draw(st.booleans())
    factory = getattr(optim, family)
    if draw(st.booleans()):  # the hyperparameters in the state
        opt = optim.inject_hyperparams(factory)(lr=lr_value, **kwargs)
    else:
        opt = factory(lr_value, **kwargs)
    if draw(st.booleans()):
        opt = optim.chain(optim.clip_by_global_norm(draw(st.sampled_from([0.1, 100.0]))), opt)
    if draw(st.booleans()):
        opt = optim.masked(opt, lambda p: {k: not k.endswith("bias") or "2" in k for k in p})
    return opt


@settings(max_examples=60, deadline=None)
@given(
    opt=compositions(),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_fused_update_equals_the_reference_update(random_tree, opt, seed, dtype):
    params = random_tree(seed, dtype=dtype)
    assert optim.fused_plan(opt, params) is not None, optim.why_not_fused(opt, params)
    ref_params, ref_state = tree_clone(params), opt.init(params)
    fused_params, fused_state = tree_clone(params), opt.init(params)
    for i in range(4):
        grads = {k: 3 * v for k, v in random_tree(seed + i + 1, dtype=dtype).items()}
        time = Timestamp(batch=i)
        updates, ref_state = opt.update(tree_clone(grads), ref_state, ref_params, time=time)
        ref_params = optim.apply_updates(ref_params, updates)
        fused_state = optim.fused_update(
            opt, tree_clone(grads), fused_state, fused_params, time=time
        )
        assert fused_state is not None
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert tree_allclose(fused_params, ref_params, atol=tol, rtol=tol)
    assert tree_flatten(fused_state)[1] == tree_flatten(ref_state)[1]  # the same structure
    assert tree_allclose(fused_state, ref_state, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clipped_lion_in_float64_is_clipped_once(random_tree, dtype):
    """Found by the property above (issue 17): float64 gradients were scaled by the clipping
    factor before the kernels, and the Lion pass applied the factor a second time."""
    opt = optim.chain(optim.clip_by_global_norm(0.1), optim.lion(1e-3))
    params = random_tree(3, dtype=dtype)
    ref_params, ref_state = tree_clone(params), opt.init(params)
    fused_params, fused_state = tree_clone(params), opt.init(params)
    for i in range(3):
        grads = {k: 3 * v for k, v in random_tree(4 + i, dtype=dtype).items()}  # norm >> 0.1
        updates, ref_state = opt.update(tree_clone(grads), ref_state, ref_params)
        ref_params = optim.apply_updates(ref_params, updates)
        fused_state = optim.fused_update(opt, tree_clone(grads), fused_state, fused_params)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert tree_allclose(fused_state, ref_state, atol=tol, rtol=tol)
    assert tree_allclose(fused_params, ref_params, atol=tol, rtol=tol)


@settings(max_examples=40, deadline=None)
@given(opt=compositions(), seed=st.integers(0, 2**31 - 1), give_norm=st.booleans())
def test_a_cache_and_a_given_norm_change_nothing(random_tree, opt, seed, give_norm):
    """The donating step's fast path: the grouping kept in a `FusedCache` between calls on the
    same tensors, and the step's own gradient norm handed to a folded clip."""
    params = random_tree(seed)
    ref_params, ref_state = tree_clone(params), opt.init(params)
    fast_params, fast_state = tree_clone(params), opt.init(params)
    cache = optim.FusedCache()
    for i in range(4):
        grads = {k: 3 * v for k, v in random_tree(seed + i + 1).items()}
        time = Timestamp(batch=i)
        ref_state = optim.fused_update(opt, tree_clone(grads), ref_state, ref_params, time=time)
        norm = optim.global_norm(grads) if give_norm else None
        fast_state = optim.fused_update(
            opt, tree_clone(grads), fast_state, fast_params, norm=norm, cache=cache, time=time
        )
    assert tree_allclose(fast_params, ref_params, atol=1e-6, rtol=1e-6)
    assert tree_allclose(fast_state, ref_state, atol=1e-6, rtol=1e-6)


def test_the_cache_regroups_when_a_weight_decay_switches_on():
    """An injected weight decay of 0 is no decay at all (no group with decay); when it becomes
    0.5 the same tensors need a decayed group, so a cached grouping must not be reused."""
    decay = lambda count: 0.0 if count < 2 else 0.5  # noqa: E731 - a schedule by update count
    opt = optim.inject_hyperparams(optim.adamw)(lr=1e-2, weight_decay=decay)
    params = {"w": torch.ones(3), "b": torch.ones(2)}
    cached, uncached = tree_clone(params), tree_clone(params)
    cached_state, uncached_state = opt.init(params), opt.init(params)
    cache = optim.FusedCache()
    for _ in range(4):
        grads = {"w": torch.full((3,), 0.1), "b": torch.full((2,), 0.1)}
        cached_state = optim.fused_update(opt, tree_clone(grads), cached_state, cached, cache=cache)
        uncached_state = optim.fused_update(opt, tree_clone(grads), uncached_state, uncached)
    # the decay moved the params by lr * wd * w on the last two updates: visible at 1e-3
    assert not torch.allclose(uncached["w"], params["w"] - 4 * 1e-2, atol=1e-4)
    assert tree_allclose(cached, uncached, atol=1e-7, rtol=0)


def test_the_cache_misses_on_other_tensors_and_keeps_none_alive():
    opt = optim.adamw(1e-2, weight_decay=0.1, weight_decay_mask=optim.no_decay_mask)
    params = {"w": torch.ones(3, 2), "b": torch.ones(2)}
    state, cache = opt.init(params), optim.FusedCache()
    grads = {"w": torch.ones(3, 2), "b": torch.ones(2)}
    state = optim.fused_update(opt, tree_clone(grads), state, params, cache=cache)
    moments = [state[0].mu, state[0].nu]
    decision = (True, optim.no_decay_mask)
    assert cache.lookup(params, moments, ["w", "b"], decision) is not None
    other = {"w": params["w"].double(), "b": params["b"].double()}  # equal names, new tensors
    assert cache.lookup(other, moments, ["w", "b"], decision) is None
    assert cache.lookup(params, moments, ["w", "b"], (True, None)) is None  # another mask
    w = params.pop("w")
    ref = weakref.ref(w)
    del w
    assert ref() is None  # the cache held only a weak reference


def test_a_given_norm_is_ignored_when_a_masked_optimizer_sees_fewer_gradients():
    """The clip inside `masked` clips by the norm of the selected gradients only; the step's norm
    is of all of them, so it must not be used there."""
    opt = optim.masked(
        optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(1.0)),
        lambda p: {"a": True, "b": False},
    )
    params = {"a": torch.zeros(1), "b": torch.zeros(1)}
    grads = {"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}  # norm of all: 5; of "a": 3
    optim.fused_update(opt, grads, opt.init(params), params, norm=torch.tensor(5.0))
    assert params["a"].item() == pytest.approx(-1.0)  # clipped from 3 to 1, not to 3/5
    assert params["b"].item() == 0.0


def test_the_step_does_not_hand_its_norm_over_when_an_algorithm_changed_the_gradients():
    """The norm metric is of the gradients before `transform_grads`; a clip after an algorithm
    that scales them must clip by the norm of what it receives (computed here by hand)."""
    from functrain.step.pieces import Algorithm

    def times_ten(pieces):
        return pieces._replace(transform_grads=lambda g, s: {k: 10 * v for k, v in g.items()})

    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0]]))
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.1))
    step = functrain.compose(
        functrain.make_step(model, lambda m, b: m(b).sum(), opt, donate=True),
        Algorithm("times_ten", times_ten),
    )
    state = functrain.init(model, opt, seed=0)
    x = torch.tensor([[0.03, 0.04]])  # gradient (0.03, 0.04): norm 0.05; times ten: 0.5
    state, metrics = step(state, x)
    assert metrics["grad_norm"].item() == pytest.approx(0.05)
    # below the threshold either way: sgd moves by 0.1 * (0.3, 0.4), unclipped
    assert torch.allclose(state.params["weight"], torch.tensor([[0.97, -1.04]]))
    state, _ = step(state, 100 * x)  # gradient norm 5 (50 after scaling): clipped to 1
    expected = torch.tensor([[0.97, -1.04]]) - 0.1 * torch.tensor([[0.6, 0.8]])
    assert torch.allclose(state.params["weight"], expected, atol=1e-6)


# -- what the planner refuses, and what it reports (mutation testing, issue 17) ----------------


def test_a_core_after_the_learning_rate_has_no_fused_form():
    """The kernels run the core on the raw gradients and scale by the lr after it; a core that
    comes after a scale sees scaled gradients, which no kernel computes."""
    opt = optim.chain(optim.scale_by_learning_rate(0.1), optim.scale_by_adam())
    params = {"w": torch.ones(3)}
    assert optim.fused_plan(opt, params) is None
    assert "after another core or a scale" in optim.why_not_fused(opt, params)


def test_a_state_covering_more_names_than_the_gradients_is_not_fused():
    """Moments for a parameter without a gradient: the kernel lists would not line up, so the
    executor declines (the reference update then says what is wrong) and touches nothing."""
    opt = optim.adamw(1e-2)
    params = {"a": torch.ones(2), "b": torch.ones(3)}
    state = opt.init(params)
    before = tree_clone((params, state))
    assert optim.fused_update(opt, {"a": torch.ones(2)}, state, params) is None
    assert tree_allclose((params, state), before, atol=0)


def test_an_epoch_schedule_is_planned_as_at_a_runs_start():
    """inject_hyperparams evaluates its schedules while planning; one in epochs needs a time with
    a known epoch length, so the planner evaluates it at the start of a one-epoch run instead
    of giving up."""
    lr = 1e-2 * schedules.cosine_annealing_with_warmup("1ep", t_max="1dur")
    opt = optim.inject_hyperparams(optim.adamw)(lr=lr, weight_decay=0.1)
    plan = optim.fused_plan(opt, {"w": torch.ones(3)})
    assert plan is not None and plan.kernel == "_fused_adamw_"


def test_the_plan_names_sgds_decay_pre_pass_only_where_it_runs():
    params = {"w": torch.ones(3)}
    decoupled = optim.fused_plan(optim.decoupled_sgdw(0.1, weight_decay=1e-4), params)
    coupled = optim.fused_plan(optim.sgd(0.1, momentum=0.9, weight_decay=1e-4), params)
    plain = optim.fused_plan(optim.sgd(0.1), params)
    assert decoupled.prepasses == ("params *= 1 - decay",)
    assert str(decoupled) == "_fused_sgd_ x1 group, pre-pass params *= 1 - decay"
    assert plain.prepasses == () and str(plain) == "_fused_sgd_ x1 group"
    # sgd's weight_decay is L2 (added to the gradient before the momentum): the kernel's own
    assert coupled.prepasses == ()


def test_dtensor_parameters_run_fused_on_their_local_pieces():
    """A mesh of one rank: DTensor parameters, gradients and moments, sharded and replicated,
    take the kernels on their local pieces and give the plain tensors' reference update."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        gen = torch.Generator().manual_seed(0)
        plain = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(4, generator=gen)}
        grads = {k: torch.randn(v.shape, generator=gen) for k, v in plain.items()}
        place = {"w": [Shard(0)], "b": [Replicate()]}

        def dt(tree):
            return {k: distribute_tensor(v.clone(), mesh, place[k]) for k, v in tree.items()}

        opt = optim.chain(optim.clip_by_global_norm(0.5), optim.adamw(1e-1, weight_decay=0.1))
        ref_params, ref_state = tree_clone(plain), opt.init(plain)
        updates, ref_state = opt.update(tree_clone(grads), ref_state, ref_params)
        ref_params = optim.apply_updates(ref_params, updates)
        params = dt(plain)
        state = optim.fused_update(opt, dt(grads), opt.init(params), params)
        assert state is not None  # fused, not declined
        for k in plain:
            assert (ref_params[k] - plain[k]).abs().max() > 1e-3  # the update moved it
            assert torch.allclose(params[k].to_local(), ref_params[k], atol=1e-6, rtol=1e-6)
    finally:
        dist.destroy_process_group()


def _fused_and_reference(opt, params, steps=3):
    """`steps` updates of `opt` from `params`: (fused params, reference params)."""
    ref_params, ref_state = tree_clone(params), opt.init(params)
    fused_params, fused_state = tree_clone(params), opt.init(params)
    for i in range(steps):
        gen = torch.Generator().manual_seed(100 + i)
        grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
        updates, ref_state = opt.update(tree_clone(grads), ref_state, ref_params)
        ref_params = optim.apply_updates(ref_params, updates)
        fused_state = optim.fused_update(opt, tree_clone(grads), fused_state, fused_params)
        assert fused_state is not None
    assert tree_allclose(fused_state, ref_state, atol=1e-6, rtol=1e-6)
    return fused_params, ref_params


def test_a_decoupled_decay_after_lion_is_fused_and_matches_the_chain():
    opt = optim.chain(
        optim.scale_by_lion(),
        optim.scale_by_learning_rate(1e-2),
        optim.add_decoupled_weight_decay(0.1, lr=1e-2),
    )
    params = {"w": torch.linspace(-1, 1, 6).reshape(2, 3)}
    fused, ref = _fused_and_reference(opt, params)
    assert tree_allclose(fused, ref, atol=1e-6, rtol=1e-6)
    # by hand: each step shrinks by 1 - 0.1 (factor lr/initial lr = 1) and moves by 1e-2 * sign
    assert (fused["w"] - 0.9**3 * params["w"]).abs().max() <= 3 * 1e-2 + 1e-6


def test_a_zero_learning_rate_with_a_decoupled_decay_only_decays():
    """At an lr of 0 the kernel cannot carry the decay (AdamW's decay is lr * wd): the
    parameters shrink by exactly 1 - weight_decay per step, and nothing else moves them."""
    opt = optim.chain(
        optim.scale_by_adam(),
        optim.scale_by_learning_rate(0.0),
        optim.add_decoupled_weight_decay(0.1, lr=1e-2),
    )
    params = {"w": torch.linspace(-1, 1, 6).reshape(2, 3)}
    fused, ref = _fused_and_reference(opt, params, steps=2)
    assert torch.allclose(fused["w"], 0.81 * params["w"], atol=1e-7, rtol=0)
    assert tree_allclose(fused, ref, atol=1e-7, rtol=0)


def test_every_spec_is_frozen():
    """A spec describes what its transform's `update` computes (its closure holds the same
    values); the fused executor runs the spec. One that could be changed afterwards would make
    the two paths disagree, so every spec refuses assignment."""
    import dataclasses

    from functrain.optim import spec as spec_module

    transforms = [
        optim.scale_by_adam(),
        optim.scale_by_lion(),
        optim.trace(0.9),
        optim.scale_by_learning_rate(0.1),
        optim.scale(2.0),
        optim.add_decayed_weights(0.1),
        optim.add_decoupled_weight_decay(0.1, lr=0.1),
        optim.clip_by_global_norm(1.0),
        optim.chain(optim.scale(2.0)),
        optim.masked(optim.sgd(0.1), lambda p: {k: True for k in p}),
        optim.inject_hyperparams(optim.sgd)(lr=0.1),
    ]
    specs = [t.spec for t in transforms]
    kinds = {v for v in vars(spec_module).values() if dataclasses.is_dataclass(v)}
    assert {type(s) for s in specs} == kinds  # every spec kind of the module is checked
    for s in specs:
        field = dataclasses.fields(s)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(s, field, getattr(s, field))


def test_a_coupled_decay_after_the_learning_rate_is_not_fused():
    # the kernels apply a coupled decay to the gradient before the learning rate: after it, the
    # decay is added to the step unscaled, which no kernel computes
    params = {"w": torch.ones(3)}
    late = optim.chain(
        optim.scale_by_adam(), optim.scale_by_learning_rate(0.1), optim.add_decayed_weights(0.01)
    )
    assert optim.fused_plan(late, params) is None
    assert "after the learning rate" in optim.why_not_fused(late, params)
    early = optim.chain(
        optim.add_decayed_weights(0.01), optim.scale_by_adam(), optim.scale_by_learning_rate(0.1)
    )
    assert optim.fused_plan(early, params) is not None


# -- any memory layout: never a wrong update (issue 28) ----------------------------------------


@st.composite
def layouts(draw, ndim):
    """`(permutation, stepped)`: a tensor's dimensions ordered in memory by `permutation`, and,
    when `stepped`, every other element of a larger buffer (not dense)."""
    return draw(st.permutations(range(ndim))), draw(st.booleans())


def laid_out(t, layout):
    """`t`'s values in the memory layout `layout` (see `layouts`)."""
    order, stepped = layout
    base = t.permute(*order).contiguous()
    if stepped:  # the values at even positions of a buffer twice as long in its last dim
        base = torch.stack([base, torch.full_like(base, float("nan"))], dim=-1)[..., 0]
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return base.permute(*inverse)


SHAPES = st.tuples(st.integers(1, 4), st.integers(2, 4), st.integers(2, 5))


@settings(max_examples=30, deadline=None)
@given(
    opt=compositions(),
    shape=SHAPES,
    param_layout=layouts(3),
    grad_layouts=st.lists(layouts(3), min_size=3, max_size=3),
    seed=st.integers(0, 2**31 - 1),
)
def test_fused_equals_foreach_for_any_gradient_layout(opt, shape, param_layout, grad_layouts, seed):
    """Issue 28: a non-contiguous gradient (`torch.bmm(x, w.transpose(1, 2))` gives a 3-D weight
    one) reached the kernels, which read it as if laid out like its parameter: wrong updates,
    silently. Any gradient layout is now copied into the parameter's; a parameter that is not
    dense has no fused form (the transforms' own update runs)."""
    gen = torch.Generator().manual_seed(seed)
    values = {"2.weight": torch.randn(shape, generator=gen), "2.bias": torch.randn(shape[-1])}

    def make_params():  # (a clone would make a stepped tensor contiguous)
        weight = laid_out(values["2.weight"], param_layout)
        return {"2.weight": weight, "2.bias": values["2.bias"].clone()}

    ref_params, fused_params = make_params(), make_params()
    ref_state, fused_state = opt.init(ref_params), opt.init(fused_params)
    for i, layout in enumerate(grad_layouts):
        grad_values = {k: 3 * torch.randn(v.shape, generator=gen) for k, v in values.items()}
        grads = {
            "2.weight": laid_out(grad_values["2.weight"], layout),
            "2.bias": grad_values["2.bias"],
        }
        time = Timestamp(batch=i)
        updates, ref_state = opt.update(tree_clone(grads), ref_state, ref_params, time=time)
        ref_params = optim.apply_updates(ref_params, updates)
        before = tree_clone((fused_params, fused_state))
        is_dense = dense(fused_params["2.weight"])  # (an update may make it dense)
        new_state = optim.fused_update(opt, grads, fused_state, fused_params, time=time)
        assert (new_state is not None) == is_dense, optim.why_not_fused(opt, fused_params)
        if new_state is None:  # declined, having touched nothing: the step's fallback
            assert tree_allclose((fused_params, fused_state), before, atol=0)
            updates, new_state = opt.update(grads, fused_state, fused_params, time=time)
            fused_params = optim.apply_updates(fused_params, updates)
        fused_state = new_state
    assert tree_allclose(fused_params, ref_params, atol=1e-5, rtol=1e-5)
    assert tree_allclose(fused_state, ref_state, atol=1e-5, rtol=1e-5)


class BatchedLinear(torch.nn.Module):
    """Four linear maps in one 3-D weight, applied as `bmm(x, w^T)`: its gradient is transposed."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3, 5) / 5**0.5)

    def forward(self, x):
        return torch.bmm(x, self.weight.transpose(1, 2)).sum(0)


def bmm_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def bmm_grad(weight, batch):
    """The gradient of `bmm_loss` for the weight `weight`: transposed in memory."""
    w = weight.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(
        bmm_loss(lambda x: torch.bmm(x, w.transpose(1, 2)).sum(0), batch), w
    )
    return grad


@pytest.mark.parametrize("donate", [False, True], ids=["pure", "donated"])
@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_step_updates_a_bmm_weight_as_the_transforms_do(name, donate):
    """The case issue 28 found, end to end: the step's fused update of a weight whose gradient
    is not contiguous equals the transforms' own `update`."""
    make, _ = DOCUMENTED[name]
    torch.manual_seed(0)
    # at index 2, so that "masked(adamw)" (which trains the names "2.*") trains it
    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Identity(), BatchedLinear())
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 6, 5, generator=gen), torch.randint(0, 3, (6,), generator=gen))] * 3
    assert not bmm_grad(model[2].weight, data[0]).is_contiguous()
    opt = make()
    step = functrain.make_step(model, bmm_loss, opt, donate=donate)
    state = functrain.init(model, opt, seed=0)
    ref_params = {"2.weight": model[2].weight.detach().clone()}
    ref_state = opt.init(ref_params)
    for batch in data:
        time = state.timestamp
        state, _ = step(state, batch)
        grads = {"2.weight": bmm_grad(ref_params["2.weight"], batch)}
        updates, ref_state = opt.update(grads, ref_state, ref_params, time=time)
        ref_params = optim.apply_updates(ref_params, updates)
    assert not torch.equal(ref_params["2.weight"], model[2].weight)  # it trained
    assert torch.allclose(state.params["2.weight"], ref_params["2.weight"], atol=1e-5, rtol=1e-5)


# -- the one executor: fused or not is decided inside the optimizer (issue 26.2) ----------------


@st.composite
def any_compositions(draw):
    """A random composition, fusable or not: one in the recognised form, or one of those with a
    part that has no fused form (a transform without a spec, a clip by value, accumulation)."""
    opt = draw(compositions())
    wrap = draw(st.sampled_from(["none", "no spec", "clip_by_value", "multi_steps"]))
    if wrap == "no spec":  # the same transform, as a user would write it: no spec
        return optim.Transform(opt.init, opt.update)
    if wrap == "clip_by_value":
        return optim.chain(optim.clip_by_value(0.5), opt)
    if wrap == "multi_steps":
        return optim.multi_steps(opt, every_k=2)
    return opt


@settings(max_examples=40, deadline=None)
@given(opt=any_compositions(), seed=st.integers(0, 2**31 - 1))
def test_the_executor_equals_update_then_apply_and_fuses_exactly_what_has_a_plan(
    random_tree, opt, seed
):
    params = random_tree(seed)
    plan = optim.fused_plan(opt, params)
    ref_params, ref_state = tree_clone(params), opt.init(params)
    run_params, run_state = tree_clone(params), opt.init(params)
    for i in range(4):
        grads = {k: 3 * v for k, v in random_tree(seed + i + 1).items()}
        time = Timestamp(batch=i)
        updates, ref_state = opt.update(tree_clone(grads), ref_state, ref_params, time=time)
        ref_params = optim.apply_updates(ref_params, updates)
        with OpCounter() as counter:
            run_params, run_state = optim.update_in_place(
                opt, tree_clone(grads), run_state, run_params, time=time
            )
        fused_ran = bool(FUSED_KERNELS & set(counter.ops))
        assert fused_ran == (plan is not None and plan.kernel in FUSED_KERNELS), (plan, counter.ops)
    assert tree_allclose(run_params, ref_params, atol=1e-5, rtol=1e-5)
    assert tree_flatten(run_state)[1] == tree_flatten(ref_state)[1]
    assert tree_allclose(run_state, ref_state, atol=1e-5, rtol=1e-5)
