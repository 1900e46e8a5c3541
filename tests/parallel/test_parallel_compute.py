"""The step's collectives on one process (the multi-rank behaviour: test_parallel_multirank)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Replicate, Shard

from functrain import parallel as fdist
from functrain.optim import global_norm
from functrain.parallel import compute, placement, plans
from functrain.parallel.layout import make_layout


def test_identity_without_a_layout():
    params = {"w": torch.ones(2, requires_grad=True)}
    assert compute.gather_params(params, None) is params
    grads = {"w": torch.ones(2)}
    assert compute.finalize_grads(grads, params, None) is grads
    assert fdist.data_parallel_info(None) == (0, 1)


def test_dtensors_without_their_layout_are_a_clear_error(mesh1):
    (placed, _), _, _ = _placed(mesh1)
    with pytest.raises(ValueError, match="state.layout"):
        compute.gather_params(placed, None)


def _placed(mesh, plan="fsdp", **plan_options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    params = {k: v.detach() for k, v in model.named_parameters()}
    whole = {k: v.clone() for k, v in params.items()}
    if plan_options:
        plan = plans.Plan(name=plan, shard=plan == "fsdp", **plan_options)
    return placement.shard_params(model, params, mesh=mesh, plan=plan), whole, model


@pytest.mark.parametrize("plan", ["ddp", "fsdp"])
def test_gather_is_differentiable_into_dtensor_grads(mesh1, plan):
    (placed, layout), whole, model = _placed(mesh1, plan)
    leaves = {k: v.detach().requires_grad_() for k, v in placed.items()}
    inflight = fdist.InFlight(layout)
    gathered = compute.gather_params(leaves, layout, inflight)
    assert all(type(v) is torch.Tensor for v in gathered.values())
    assert all(torch.equal(gathered[k], whole[k]) for k in whole)
    x = torch.randn(4, 3)
    loss = torch.func.functional_call(model, gathered, (x,)).square().mean()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    grads = compute.finalize_grads(dict(zip(leaves, grads)), placed, layout, inflight)
    expected = torch.autograd.grad(
        torch.func.functional_call(model, {k: v.requires_grad_() for k, v in whole.items()}, (x,))
        .square()
        .mean(),
        list(whole.values()),
    )
    for (name, grad), want in zip(grads.items(), expected):
        assert isinstance(grad, DTensor) and grad.placements == placed[name].placements
        torch.testing.assert_close(grad.full_tensor(), want)


def test_plain_grads_of_dtensors_are_placed_by_finalize(mesh1):
    (placed, layout), whole, _ = _placed(mesh1)
    local = {k: torch.full_like(v, 2.0) for k, v in whole.items()}
    grads = compute.finalize_grads(local, placed, layout)
    for name, grad in grads.items():
        assert isinstance(grad, DTensor) and grad.placements == placed[name].placements
        assert torch.equal(grad.full_tensor(), local[name])


def test_bucket_cap_splits_collectives(mesh1):
    (_, layout), _, _ = _placed(mesh1, "fsdp", bucket_mb=30 / (1 << 20))  # 30 bytes: ~1 each
    assert len(layout.buckets) >= 3
    (_, layout), _, _ = _placed(mesh1, "fsdp")
    assert len(layout.buckets) == 1


def test_a_subset_of_a_bucket_gets_buckets_of_its_own(mesh1):
    (placed, layout), whole, _ = _placed(mesh1)
    subset = {"1.weight": placed["1.weight"], "0.bias": placed["0.bias"]}
    (bucket,) = layout.buckets_for(subset)
    assert bucket.names == ("1.weight", "0.bias")  # in the order given
    gathered = compute.gather_params(subset, layout)
    assert torch.equal(gathered["1.weight"], whole["1.weight"])


def test_params_that_do_not_fit_their_layout_are_rejected(mesh1):
    (placed, layout), _, _ = _placed(mesh1)
    wrong = {**placed, "0.weight": DTensor.from_local(torch.ones(2, 2), mesh1, [Replicate()] * 3)}
    with pytest.raises(ValueError, match="different states"):
        compute.gather_params(wrong, layout)


def test_mixed_precision_policy_gathers_in_param_dtype(mesh1):
    placed, whole, _ = _placed(
        mesh1, "fsdp", param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    placed, layout = placed
    leaves = {k: v.detach().requires_grad_() for k, v in placed.items()}
    gathered = compute.gather_params(leaves, layout)
    assert all(v.dtype == torch.bfloat16 for v in gathered.values())
    loss = sum(v.float().sum() for v in gathered.values())
    grads = torch.autograd.grad(loss, list(leaves.values()))
    assert all(g.dtype == torch.float32 for g in grads)


def test_params_on_a_foreign_mesh_are_rejected(mesh1):
    sub = mesh1["dp_shard"]
    foreign = DTensor.from_local(torch.ones(2), sub, [Replicate()])
    with pytest.raises(ValueError, match="functrain expects"):
        make_layout(mesh1, plans.fsdp(), {"w": foreign}, trainable=frozenset("w"))
    bad = DTensor.from_local(torch.ones(2), mesh1, [Shard(0), Replicate(), Replicate()])
    with pytest.raises(ValueError, match="dp_replicate"):
        make_layout(mesh1, plans.fsdp(), {"w": bad}, trainable=frozenset("w"))
    (_, layout), _, _ = _placed(mesh1)
    with pytest.raises(ValueError, match="does not place"):
        compute.gather_params({"w": DTensor.from_local(torch.ones(2), mesh1, [Replicate()] * 3)},
                              layout)  # fmt: skip


def test_global_norm_plain_and_dtensor(mesh1):
    tree = {"a": torch.tensor([3.0]), "b": {"c": torch.tensor([4.0])}}
    assert float(global_norm(tree)) == 5.0
    (placed, _), whole, _ = _placed(mesh1)
    want = torch.linalg.vector_norm(torch.cat([v.reshape(-1) for v in whole.values()]))
    torch.testing.assert_close(global_norm(placed), want)
    assert float(global_norm({})) == 0.0


def test_mean_over_one_rank_is_the_value(mesh1):
    tree = {"loss": torch.tensor(2.5), "acc": torch.tensor([0.5, 1.0]), "n": 3}
    (_, layout), _, _ = _placed(mesh1)
    out = fdist.mean_over_data_parallel(tree, layout)
    assert out["n"] == 3 and torch.equal(out["acc"], tree["acc"])


@settings(max_examples=20, deadline=None)
@given(microbatches=st.integers(1, 4), seed=st.integers(0, 100))
def test_accumulate_grads_equals_the_summed_objective(microbatches, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, generator=gen, requires_grad=True)
    b = torch.randn((), generator=gen, requires_grad=True)
    xs = torch.randn(microbatches, 4, 3, generator=gen)

    def objective(i):
        return lambda p: (((xs[i] @ p["w"]) + p["b"]).square().mean(), i)

    grads, outs = compute.accumulate_grads(
        {"w": w, "b": b}, [objective(i) for i in range(microbatches)], None
    )
    total = sum(((xs[i] @ w) + b).square().mean() for i in range(microbatches))
    want = torch.autograd.grad(total, [w, b])
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, ref)
    assert [aux for _, aux in outs] == list(range(microbatches))


def test_accumulate_grads_zero_for_unused_params():
    w = torch.ones(2, requires_grad=True)
    unused = torch.ones(3, requires_grad=True)
    grads, _ = compute.accumulate_grads(
        {"w": w, "u": unused}, [lambda p: (p["w"].sum(), None)] * 2, None
    )
    assert torch.equal(grads[0], torch.full((2,), 2.0)) and torch.equal(grads[1], torch.zeros(3))


def test_mean_without_a_layout_is_the_value_itself():
    tree = {"loss": torch.tensor(2.5), "n": 3}
    assert fdist.mean_over_data_parallel(tree, None) is tree


def test_plain_grad_of_one_dtensor_param_is_placed_by_finalize(mesh1):
    # a one-parameter subset has a bucket of its own with a single name
    (placed, layout), whole, _ = _placed(mesh1)
    one = {"1.bias": placed["1.bias"]}
    local = {"1.bias": torch.tensor([1.5, -2.0])}
    (bucket,) = layout.buckets_for(one)
    assert bucket.names == ("1.bias",)
    grads = compute.finalize_grads(local, one, layout)
    assert isinstance(grads["1.bias"], DTensor)
    assert grads["1.bias"].placements == placed["1.bias"].placements
    assert torch.equal(grads["1.bias"].full_tensor(), local["1.bias"])
