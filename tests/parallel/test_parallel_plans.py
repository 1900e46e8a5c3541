"""Sharding plans: placement rules (on a stand-in mesh) and shard_params on a one-process mesh."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate, Shard

import functrain
from functrain import parallel as fdist
from functrain.parallel import placement, plans


class FakeMesh:
    """Only what the placement rules read: sizes and this rank's coordinates."""

    def __init__(self, dp_replicate=1, dp_shard=1, tp=1, coords=(0, 0, 0)):
        self.sizes = (dp_replicate, dp_shard, tp)
        self.coords = coords

    def size(self, dim=None):
        return self.sizes[dim]

    def get_local_rank(self, dim):
        return self.coords[dim]


def test_resolve_plan_by_name_and_errors():
    assert plans.resolve_plan("FSDP").shard and not plans.resolve_plan("ddp").shard
    assert plans.resolve_plan("tp+fsdp").tp == "auto" and plans.resolve_plan("tp+fsdp").shard
    assert plans.resolve_plan(None).name == "ddp"
    custom = plans.fsdp(param_dtype=torch.bfloat16)
    assert plans.resolve_plan(custom) is custom
    with pytest.raises(ValueError, match="unknown sharding plan 'zero3'"):
        plans.resolve_plan("zero3")


@pytest.mark.parametrize(
    "plan, style, attr, shape, mesh, expected",
    [
        (
            "ddp",
            None,
            "weight",
            (4, 3),
            FakeMesh(dp_shard=4),
            (Replicate(), Replicate(), Replicate()),
        ),
        (
            "fsdp",
            None,
            "weight",
            (4, 3),
            FakeMesh(dp_shard=4),
            (Replicate(), Shard(0), Replicate()),
        ),
        (
            "fsdp",
            None,
            "weight",
            (4, 3),
            FakeMesh(dp_shard=1),
            (Replicate(), Replicate(), Replicate()),
        ),
        ("hsdp", None, "bias", (5,), FakeMesh(2, 2), (Replicate(), Shard(0), Replicate())),
        ("fsdp", None, "scale", (), FakeMesh(dp_shard=2), (Replicate(), Replicate(), Replicate())),
        ("tp", "colwise", "weight", (8, 4), FakeMesh(tp=2), (Replicate(), Replicate(), Shard(0))),
        ("tp", "rowwise", "weight", (4, 8), FakeMesh(tp=2), (Replicate(), Replicate(), Shard(1))),
        ("tp", "rowwise", "bias", (4,), FakeMesh(tp=2), (Replicate(), Replicate(), Replicate())),
        # tp+fsdp: FSDP takes a dim TP leaves whole; a 1-D TP-sharded bias stays replicated
        (
            "tp+fsdp",
            "colwise",
            "weight",
            (8, 4),
            FakeMesh(dp_shard=2, tp=2),
            (Replicate(), Shard(1), Shard(0)),
        ),
        (
            "tp+fsdp",
            "rowwise",
            "weight",
            (4, 8),
            FakeMesh(dp_shard=2, tp=2),
            (Replicate(), Shard(0), Shard(1)),
        ),
        (
            "tp+fsdp",
            "colwise",
            "bias",
            (8,),
            FakeMesh(dp_shard=2, tp=2),
            (Replicate(), Replicate(), Shard(0)),
        ),
    ],
)
def test_param_placements(plan, style, attr, shape, mesh, expected):
    placements = placement.param_placements("p", shape, style, attr, mesh, plans.resolve_plan(plan))
    assert placements == expected


def test_local_piece_matches_dtensor_chunks():
    full = torch.arange(10.0).view(5, 2)
    pieces = [
        placement.local_piece(
            full, FakeMesh(dp_shard=4, coords=(0, r, 0)), (Replicate(), Shard(0), Replicate())
        )
        for r in range(4)
    ]
    assert [p.shape[0] for p in pieces] == [2, 2, 1, 0]
    assert torch.equal(torch.cat(pieces), full)


class Tied(nn.Module):
    def __init__(self, freeze=False):
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight
        self.fc2.bias.requires_grad_(not freeze)

    def forward(self, tokens):
        return self.head(self.fc2(F.relu(self.fc1(self.embed(tokens)))))


def _loss(model, batch):
    tokens, targets = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("plan", ["ddp", "fsdp", "tp+fsdp"])
def test_shard_params_puts_the_same_dtensors_in_the_model(mesh1, plan):
    torch.manual_seed(0)
    model = Tied(freeze=True)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    state = functrain.init(model, functrain.optim.sgd(0.1), seed=0, mesh=mesh1, plan=plan)
    assert list(state.params) == list(before)
    for name, param in model.named_parameters():
        assert (
            isinstance(param, DTensor)
            and param.to_local().data_ptr() == state.params[name].to_local().data_ptr()
        )
        assert torch.equal(param.full_tensor(), before[name])
    assert model.head.weight is model.embed.weight  # still tied
    assert not model.fc2.bias.requires_grad
    if plan == "tp+fsdp":
        assert dict(state.layout.tp_styles) == {"fc1": "colwise", "fc2": "rowwise"}
    # nothing of the plan is left on the module: no attribute, hook or replaced forward
    for module in model.modules():
        assert not any(k.startswith("_functrain") for k in vars(module))
        assert "forward" not in vars(module) and not module._forward_pre_hooks
    assert state.layout.plan.name == plan and state.layout.dp_size == 1


def _train_both_ways(mesh1, freeze, **step_options):
    gen = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(0, 6, (4, 3), generator=gen), torch.randint(0, 6, (4, 3), generator=gen))
        for _ in range(3)
    ]
    results = []
    for mesh, plan in ((None, None), (mesh1, "fsdp")):
        torch.manual_seed(0)
        model = Tied(freeze)
        opt = functrain.optim.adamw(1e-2)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
        step = functrain.make_step(model, _loss, opt, **step_options)
        for batch in batches:
            state, _ = step(state, batch)
        results.append(fdist.full_params(state.params))
    for name in results[0]:
        torch.testing.assert_close(results[1][name], results[0][name], rtol=0, atol=1e-6)


def test_one_process_mesh_trains_like_no_mesh(mesh1):
    _train_both_ways(mesh1, freeze=False)


def test_one_process_mesh_with_microbatches(mesh1):
    _train_both_ways(mesh1, freeze=False, microbatch_size=2)


def test_frozen_sharded_params_are_gathered_too(mesh1):
    _train_both_ways(mesh1, freeze=True)


def test_plan_without_mesh_is_an_error():
    with pytest.raises(ValueError, match="needs a mesh"):
        placement.shard_params(nn.Linear(2, 2), {}, mesh=None, plan="fsdp")


def test_tp_errors_name_the_layer(mesh1):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Conv1d(2, 2, 1)
            self.fc2 = nn.Linear(2, 2)

    model = Odd()
    params = {k: v.detach() for k, v in model.named_parameters()}
    with pytest.raises(TypeError, match="'fc1' is Conv1d"):
        placement.shard_params(model, params, mesh=mesh1, plan=plans.tp({"fc1": "colwise"}))
    tied = Tied()
    params = {k: v.detach() for k, v in tied.named_parameters()}
    with pytest.raises(ValueError, match="tied"):
        placement.shard_params(tied, params, mesh=mesh1, plan=plans.tp({"head": "colwise"}))


class NoReset(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(3))


def test_meta_model_materialises_per_module_from_the_seed(mesh1):
    def build():
        with torch.device("meta"):
            return Tied()

    def placed(seed):
        model = build()
        params = {k: v.detach() for k, v in model.named_parameters()}
        return fdist.full_params(
            placement.shard_params(model, params, mesh=mesh1, plan="fsdp", seed=seed)[0]
        )

    a, b, c = placed(3), placed(3), placed(4)
    assert all(not v.is_meta for v in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc1.weight"], c["fc1.weight"])
    model = nn.Sequential(NoReset())
    with torch.device("meta"):
        model = nn.Sequential(NoReset())
    with pytest.raises(ValueError, match="no reset_parameters"):
        placement.shard_params(model, {"0.w": model[0].w}, mesh=mesh1, plan="ddp")

    class MaskOnly(nn.Module):  # a buffer computed in __init__ is lost on the meta device
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.ones(3, 3).tril())

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 2), MaskOnly())
    params = {k: v.detach() for k, v in model.named_parameters()}
    with pytest.raises(ValueError, match="parameters or buffers"):
        placement.shard_params(model, params, mesh=mesh1, plan="ddp")


def test_param_dtype_casts_inputs_and_computes_in_it(mesh1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = functrain.optim.sgd(0.1)
    plan = plans.fsdp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    state = functrain.init(model, opt, seed=0, mesh=mesh1, plan=plan)
    step = functrain.make_step(model, lambda m, b: F.mse_loss(m(b[0]).float(), b[1]), opt)
    out = step.pieces.call_model(state, torch.randn(5, 3))
    assert out.dtype == torch.bfloat16
    state, metrics = step(state, (torch.randn(5, 3), torch.randn(5, 2)))
    assert all(v.dtype == torch.float32 for v in state.params.values())
    assert torch.isfinite(metrics["loss"])
    assert not model._forward_pre_hooks  # the cast is installed only while the step runs
    # a second layout of the same model, without param_dtype: each state keeps its own
    fp32 = functrain.init(model, opt, seed=0, mesh=mesh1, plan="fsdp")
    assert step.pieces.call_model(fp32, torch.randn(5, 3)).dtype == torch.float32
    assert step.pieces.call_model(state, torch.randn(5, 3)).dtype == torch.bfloat16


def test_launched_world_size_reads_world_size_only_without_a_process_group(monkeypatch):
    # as a torchrun rank before init_process_group: $WORLD_SIZE, and 1 where it is not a count
    monkeypatch.setattr(plans.dist, "is_initialized", lambda: False)
    for value, expected in (("4", 4), ("1", 1), ("0", 1), ("four", 1), ("", 1)):
        monkeypatch.setenv("WORLD_SIZE", value)
        assert plans.launched_world_size() == expected, value
    monkeypatch.delenv("WORLD_SIZE")
    assert plans.launched_world_size() == 1


def test_broadcast_chunks_split_by_size_cap_and_dtype():
    f32 = [torch.zeros(n) for n in (3, 2, 4)]  # 12, 8 and 16 bytes
    f64 = torch.zeros(1, dtype=torch.float64)
    chunks = list(placement._chunks([f32[0], f32[1], f64, f32[2]], cap_bytes=20))
    # 12 + 8 = 20 bytes fit the cap; a new dtype starts a chunk; so does the next float32
    assert [[id(t) for t in c] for c in chunks] == [
        [id(f32[0]), id(f32[1])],
        [id(f64)],
        [id(f32[2])],
    ]
    # a tensor larger than the cap is a chunk of its own, never dropped
    big = [torch.zeros(8), torch.zeros(1)]
    assert [len(c) for c in placement._chunks(big, cap_bytes=4)] == [1, 1]
    assert list(placement._chunks([], cap_bytes=4)) == []


def test_meta_model_is_placed_one_module_at_a_time(mesh1):
    # the docstring's promise: at most one module is whole on a rank, so each module's
    # parameters are already sharded (DTensors) when the next module is materialised
    seen, built = [], []

    class Recorder(nn.Linear):
        def reset_parameters(self):
            super().reset_parameters()
            if built:  # not while the model is built on the meta device
                seen.append([isinstance(m.weight, DTensor) for m in built[0] if m is not self])

    with torch.device("meta"):
        model = nn.Sequential(Recorder(2, 3), Recorder(3, 2))
    built.append(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    placement.shard_params(model, params, mesh=mesh1, plan="fsdp", seed=0)
    # resetting the second Linear: the first is already placed
    assert seen == [[False], [True]]


def test_bucket_default_is_ddps_25_mb():
    # torch DDP's bucket_cap_mb default (25 MiB); every data-parallel plan starts from it
    assert plans.ddp().bucket_mb == plans.fsdp().bucket_mb == plans.Plan("x").bucket_mb == 25.0


def test_default_placement_keeps_a_given_mesh():
    given = object()  # any mesh value: default_placement only passes it through
    assert plans.default_placement(given, "fsdp") == (given, "fsdp")
    assert plans.default_placement(given, None) == (given, None)


def test_local_plan_takes_no_mesh():
    assert plans.default_placement(None, "local") == (None, None)
    assert plans.default_placement(None, "LOCAL") == (None, None)
    with pytest.raises(ValueError, match="takes no mesh"):
        plans.default_placement(object(), "local")


def test_a_parameter_after_an_empty_slot_is_placed_too(mesh1):
    # MultiheadAttention with kdim != embed_dim registers in_proj_weight=None *before*
    # in_proj_bias: a walk that stops at the empty slot would lose the bias
    torch.manual_seed(0)
    model = nn.MultiheadAttention(8, 2, kdim=4, vdim=4)
    assert list(model._parameters)[:5] == [
        "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_weight", "in_proj_bias"
    ]  # fmt: skip
    bias = model.in_proj_bias.detach().clone()
    state = functrain.init(model, functrain.optim.sgd(0.1), seed=0, mesh=mesh1, plan="fsdp")
    assert isinstance(model.in_proj_bias, DTensor)
    assert torch.equal(state.params["in_proj_bias"].full_tensor(), bias)
