"""`fsdp(offload=True)`: parameter shards and optimizer state in host memory between steps.

One process on a one-rank mesh for the mechanism (on a CPU the compute device is the host, but the
copies are still made, into other tensors: the tests see them), and one 2-rank launch of
tests/parallel/offload_worker.py for the comparisons: offloaded runs equal the same runs without
offload bit for bit, and one process within 1e-5; fit with checkpoints resumes bit-identically,
also across the offloaded and the plain layout.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from parallel_launching import launched_results

import functrain
from functrain import checkpoint
from functrain import parallel as fdist
from functrain.parallel import offload, plans
from functrain.tree import tree_leaves

OFFLOAD = plans.fsdp(offload=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _batches(n=3):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=gen), torch.randn(4, 2, generator=gen)) for _ in range(n)]


def _setup(mesh, plan, loss=None, donate=True, opt=None, **options):
    torch.manual_seed(0)
    model = Net()
    opt = opt or functrain.optim.adamw(1e-2)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)

    def mse(model, batch):
        return F.mse_loss(model(batch[0]), batch[1])

    return model, state, functrain.make_step(model, loss or mse, opt, donate=donate, **options)


def _locals(tree) -> list[torch.Tensor]:
    return [x.to_local() for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


# -- the plan and the layout -----------------------------------------------------------------------


def test_offload_needs_a_sharded_plan_without_tensor_parallelism():
    with pytest.raises(ValueError, match=r"needs a sharded plan: use fsdp\(offload=True\)"):
        plans.ddp(offload=True)
    with pytest.raises(ValueError, match="not supported with tensor parallelism"):
        plans.tp(shard=True, offload=True)
    with pytest.raises(TypeError, match="offload must be True or False"):
        plans.fsdp(offload="cpu")
    assert plans.hsdp(offload=True).offload and not plans.fsdp().offload


def test_the_layout_records_offload_per_parameter_and_the_shards_live_on_the_host(mesh1):
    model, state, _ = _setup(mesh1, OFFLOAD)
    policies = dict(state.layout.policies)
    assert set(policies) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert all(p.offload and p.pin_memory for p in policies.values()) and state.layout.offloaded
    _, plain, _ = _setup(mesh1, "fsdp")
    assert not plain.layout.offloaded and plain.layout != state.layout
    assert {str(t.device) for t in _locals(state.params) + _locals(state.opt_state)} == {"cpu"}
    # as FSDP2: the model's parameters are the state's (host) DTensors, no whole copy is kept
    assert all(p is state.params[n] or p.data_ptr() == state.params[n].data_ptr()
               for n, p in model.named_parameters())  # fmt: skip


# -- the mechanism ---------------------------------------------------------------------------------


def test_the_forward_runs_on_copies_and_the_update_writes_the_host_shards(mesh1):
    """The model sees tensors that share no memory with the state's shards (the copies to the
    compute device); the gradients the update gets share no memory with those the backward
    pass made (copied to the host); a donating step updates the host shards and the host
    optimizer state in place. Without offload, on one rank, the forward sees the state's own
    memory and the update the backward's gradients (so the test can tell)."""
    seen, backward, given = [], [], []

    def loss(model, batch):
        for p in model.parameters():
            seen.append(p.untyped_storage().data_ptr())
            p.register_hook(lambda g: backward.append(g.untyped_storage().data_ptr()))
        return F.mse_loss(model(batch[0]), batch[1])

    def spy(grads, state):
        given.extend(_storages(_locals(grads)))
        return grads

    watch = functrain.Algorithm("spy", lambda p: p._replace(transform_grads=spy))
    for plan, shares in ((OFFLOAD, False), ("fsdp", True)):
        seen.clear(), backward.clear(), given.clear()
        _, state, step = _setup(mesh1, plan, loss)
        step = functrain.compose(step, watch)
        host = _storages(_locals(state.params))
        opt_host = _storages(_locals(state.opt_state))
        before = [t.clone() for t in _locals(state.params)]
        new, _ = step(state, _batches(1)[0])
        assert len(backward) == len(given) == 4
        assert bool(host & set(seen)) is shares, plan
        assert bool(set(backward) & set(given)) is shares, plan
        assert _storages(_locals(new.params)) == host  # updated in place, where they live
        assert _storages(_locals(new.opt_state)) == opt_host
        assert not any(torch.equal(a, b) for a, b in zip(before, _locals(new.params)))


def test_each_step_copies_the_shards_to_the_device_and_the_gradients_back(mesh1):
    model = Net()
    model.fc1.bias.requires_grad_(False)  # frozen: copied to the device, no gradient back
    opt = functrain.optim.adamw(1e-2)
    state = functrain.init(model, opt, mesh=mesh1, plan=OFFLOAD)
    step = functrain.make_step(model, lambda m, b: F.mse_loss(m(b[0]), b[1]), opt)
    every = sum(t.numel() * 4 for t in _locals(state.params))
    trainable = every - 8 * 4
    for batch in _batches(2):
        fdist.COUNTER.reset()
        state, _ = step(state, batch)
        assert fdist.COUNTER.payload_bytes["host_to_device"] == every
        assert fdist.COUNTER.payload_bytes["device_to_host"] == trainable
        assert fdist.COUNTER.calls["host_to_device"] == 4
        assert fdist.COUNTER.sent_bytes == 0  # copies are not network traffic
    fdist.COUNTER.reset()
    _, plain, plain_step = _setup(mesh1, "fsdp")
    plain_step(plain, _batches(1)[0])
    assert not fdist.COUNTER.payload_bytes  # nothing copied without offload


@pytest.mark.parametrize(
    "options",
    [{}, {"precision": "amp_fp16"}, {"skip_nonfinite": True}],
    ids=["fp32", "fp16", "skip"],
)
def test_offloaded_steps_equal_plain_ones_pure_and_donated_and_evaluation_too(mesh1, options):
    results = {}
    for plan in (OFFLOAD, "fsdp"):
        for donate in (True, False):
            _, state, step = _setup(mesh1, plan, donate=donate, **options)
            for batch in _batches():
                state, metrics = step(state, batch)
            x = _batches(1)[0][0]
            results[plan, donate] = (fdist.full_params(state.params), step.call_model(state, x),
                                     metrics["grad_norm"])  # fmt: skip
    reference = results["fsdp", True]
    for key, (params, out, norm) in results.items():
        assert all(torch.equal(params[k], reference[0][k]) for k in params), key
        assert torch.equal(out, reference[1]) and torch.equal(norm, reference[2]), key


@pytest.mark.slow
def test_compile_step_of_an_offloaded_state_equals_the_eager_step(mesh1):
    results = []
    for compiled in (False, True):
        _, state, step = _setup(mesh1, OFFLOAD)
        step = functrain.compile_step(step) if compiled else step
        for batch in _batches():
            state, _ = step(state, batch)
        assert {str(t.device) for t in _locals(state.params)} == {"cpu"}
        results.append(fdist.full_params(state.params))
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=0, atol=1e-5)


def test_a_pure_offloaded_step_leaves_its_input_state_alone(mesh1):
    _, state, step = _setup(mesh1, OFFLOAD, donate=False)
    before = [t.clone() for t in _locals(state)]
    new, _ = step(state, _batches(1)[0])
    assert all(torch.equal(a, b) for a, b in zip(before, _locals(state)))
    assert {str(t.device) for t in _locals(new.params) + _locals(new.opt_state)} == {"cpu"}


# -- the optimizer-state check ---------------------------------------------------------------------


def test_the_step_accepts_the_host_state_and_refuses_a_real_device_mismatch(mesh1):
    """A host optimizer state of an offloaded layout passes the step's check; a moment whose
    piece is on another device than its parameter's, or a parameter of an offloaded layout that
    is not on the host, is a clear error (the meta device stands in for 'not the host')."""
    _, state, step = _setup(mesh1, OFFLOAD)
    step(state, _batches(1)[0])  # accepted
    _, state, step = _setup(mesh1, OFFLOAD)
    adam, *rest = state.opt_state  # adamw: (ScaleByAdamState, ...)
    moved = offload.dtensor_like(torch.empty(8, 3, device="meta"), adam.mu["fc1.weight"])
    bad = state.replace(opt_state=(adam._replace(mu={**adam.mu, "fc1.weight": moved}), *rest))
    with pytest.raises(ValueError, match=r"mu.fc1.weight is on meta but parameter 'fc1.weight' "):
        step(bad, _batches(1)[0])
    _, state, step = _setup(mesh1, OFFLOAD)
    meta = offload.dtensor_like(torch.empty(8, 3, device="meta"), state.params["fc1.weight"])
    with pytest.raises(ValueError, match=r"'fc1.weight' is on meta but its layout offloads it"):
        step(state.replace(params={**state.params, "fc1.weight": meta}), _batches(1)[0])


# -- checkpoints -----------------------------------------------------------------------------------


def test_a_checkpoint_loads_into_an_offloaded_state_and_back(mesh1, tmp_path):
    _, state, step = _setup(mesh1, OFFLOAD)
    state, _ = step(state, _batches(1)[0])
    checkpoint.save(str(tmp_path / "a"), state)
    for plan, inplace in ((OFFLOAD, False), (OFFLOAD, True), ("fsdp", False)):
        _, like, like_step = _setup(mesh1, plan)
        loaded = checkpoint.load(str(tmp_path / "a"), like=like, inplace=inplace)
        assert loaded.layout is like.layout
        for got, want in zip(_locals(loaded), _locals(state)):
            assert torch.equal(got, want) and got.device == want.device
        loaded, _ = like_step(loaded, _batches(2)[1])  # and it steps
        assert loaded.step == 2


# -- two ranks -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launched_results(tmp_path_factory, "offload_worker.py", with_dir=True)


VARIANTS = ["fsdp", "reshard", "microbatch", "pure_step", "clip_host_norm", "unfused_sgd",
            "frozen", "dropout", "amp_bf16", "param_dtype_bf16", "replicas"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_two_ranks_offloaded_equal_two_ranks_plain_bit_for_bit(results, variant):
    got = results["variants"][variant]
    assert got["identical"], got
    assert got["where"] == {"params": ["cpu"], "opt": ["cpu"], "offload": [True]}
    assert got["h2d_ok"] and got["d2h_ok"] and got["none_without"], got


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant",
    ["fsdp", "reshard", "microbatch", "clip_host_norm", "unfused_sgd", "frozen", "replicas"],
)
def test_two_ranks_offloaded_match_one_process(results, variant):
    assert results["variants"][variant]["vs_one_process"] <= 1e-5


@pytest.mark.slow
def test_fit_offloaded_equals_fit_plain_and_resumes_bit_identically_across_layouts(results):
    fit = results["fit"]
    assert results["world"] == 2 and fit["offload_equals_plain"], fit
    for name, offloaded in (
        ("offload_to_offload", True),
        ("plain_to_offload", True),
        ("offload_to_plain", False),
    ):
        got = fit[name]
        assert got["resumed_from"].endswith("step_000000004"), got
        assert got["identical"] and got["offloaded"] is offloaded, got
