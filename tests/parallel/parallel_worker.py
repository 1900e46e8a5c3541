"""Multi-rank scenarios for tests/parallel/test_parallel_multirank.py (run on every rank).

Launched as `python -m functrain.launch -n N tests/parallel/parallel_worker.py --out r.json --world N`, or
imported and called in-process when pytest itself runs under the launcher. Every scenario trains
(or computes) on all ranks, compares with a single-process reference that every rank computes
locally on the same global batch, and returns numbers; rank 0 writes them as JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import value_scenarios  # beside this file: on the path as the script's folder, and in pytest
from parallel_launching import finish_worker

import functrain
from functrain import parallel as fdist
from functrain.parallel import compute as fcompute
from functrain.parallel import mesh as fmesh
from functrain.parallel import placement as fplacement
from functrain.parallel import plans as fplans
from functrain.parallel import sync_bn as fsync

STEPS = 20
RESHARD = fplans.fsdp(reshard_after_forward=True)  # gathered per module at use
BATCH = 8


# -- models -----------------------------------------------------------------------------------


class MLP(nn.Module):
    """Odd widths, so every FSDP shard is uneven on 2 and 4 ranks (a 5-wide bias: 2, 2, 1, 0)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(7, 13)
        self.fc2 = nn.Linear(13, 5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class TiedLM(nn.Module):
    """Embedding and output head share one weight."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        # no key bias: softmax ignores it, so its exact gradient is 0 and Adam would amplify the
        # rounding noise around 0 into full-size steps that differ run to run
        self.q, self.k, self.v = (
            nn.Linear(dim, dim),
            nn.Linear(dim, dim, bias=False),
            nn.Linear(dim, dim),
        )
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism a rank holds heads / tp of them
        q, k, v = (
            f(x).view(b, t, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Pre-norm blocks, tied embedding/head: q/k/v/fc1 column-, o_proj/fc2 row-parallel."""

    def __init__(self, vocab=17, dim=16, heads=4, context=6, layers=1):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def classify_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def lm_loss(model, batch):
    tokens, targets = batch
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make(kind: str):
    torch.manual_seed(0)
    return {"mlp": MLP, "tied": TiedLM, "gpt": TinyGPT}[kind]()


def batches(kind: str, steps: int = STEPS, size: int = BATCH):
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        if kind == "mlp":
            out.append(
                (torch.randn(size, 7, generator=gen), torch.randint(0, 5, (size,), generator=gen))
            )
        elif kind == "tied":
            out.append(
                (
                    torch.randint(0, 11, (size, 3), generator=gen),
                    torch.randint(0, 11, (size, 3), generator=gen),
                )
            )
        else:
            seq = torch.randint(0, 17, (size, 7), generator=gen)
            out.append((seq[:, :-1], seq[:, 1:]))
    return out


def rank_slice(batch, rank: int, world: int):
    per = batch[0].shape[0] // world
    return tuple(t[rank * per : (rank + 1) * per] for t in batch)


def optimizer():
    # clipping is active (grad norms are ~1): equal results prove the cross-shard global norm
    return functrain.optim.chain(
        functrain.optim.clip_by_global_norm(0.3), functrain.optim.adamw(1e-2)
    )


# -- helpers ----------------------------------------------------------------------------------


def reference(kind: str, steps: int = STEPS, opt=None, donate: bool = False, microbatch=None):
    """Single-process training on the global batches: `({name: tensor}, [loss per step])`."""
    model = make(kind)
    opt = opt or optimizer()
    state = functrain.init(model, opt, seed=0, plan="local")  # this rank alone, on purpose
    loss_fn = lm_loss if kind != "mlp" else classify_loss
    step = functrain.make_step(model, loss_fn, opt, donate=donate, microbatch_size=microbatch)
    losses = []
    for batch in batches(kind, steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return {k: v.detach() for k, v in state.params.items()}, losses


def train(
    kind: str, mesh, plan, steps: int = STEPS, opt=None, donate: bool = False, microbatch=None
):
    """Training on the mesh, each data-parallel rank on its slice of the same global batches."""
    model = make(kind)
    opt = opt or optimizer()
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
    loss_fn = lm_loss if kind != "mlp" else classify_loss
    step = functrain.make_step(model, loss_fn, opt, donate=donate, microbatch_size=microbatch)
    rank, world = fdist.data_parallel_info(state.layout)
    losses = []
    fdist.COUNTER.reset()
    for batch in batches(kind, steps):
        state, metrics = step(state, rank_slice(batch, rank, world))
        losses.append(float(metrics["loss"]))
    comm = fdist.COUNTER.snapshot()
    return state, losses, comm


def max_error(a: dict, b: dict | None) -> float | None:
    """Largest elementwise difference (None off rank 0, where no reference was computed)."""
    if b is None:
        return None
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def on_rank0(fn, *args, **kwargs):
    """`fn(...)` on rank 0 only (the single-process references), None elsewhere."""
    return fn(*args, **kwargs) if torch.distributed.get_rank() == 0 else None


def param_bytes(params: dict) -> int:
    return sum(p.numel() * p.element_size() for p in params.values())


def mesh_for(world: int, dp_replicate=1, tp=1):
    return fdist.init_mesh(dp_shard=-1, dp_replicate=dp_replicate, tp=tp)


# -- scenarios --------------------------------------------------------------------------------


def scenario_plan(
    kind: str, plan, dp_replicate: int = 1, tp: int = 1, fused=False, microbatch=None
):
    """`plan` (a name or a Plan) on N ranks vs one process. `fused`: plain AdamW in a donating
    step, so both take the fused in-place kernel (on DTensors' local pieces under the mesh)
    instead of the chain with global-norm clipping. `microbatch`: samples per microbatch."""

    def run(world):
        opt = functrain.optim.adamw(1e-2) if fused else None
        ref, ref_losses = on_rank0(
            reference, kind, opt=opt, donate=fused, microbatch=microbatch
        ) or (None, None)
        mesh = mesh_for(world, dp_replicate, tp)
        kernel, fused_calls = torch._fused_adamw_, []
        torch._fused_adamw_ = lambda *a, **k: fused_calls.append(1) or kernel(*a, **k)
        try:
            state, losses, comm = train(
                kind, mesh, plan, opt=opt, donate=fused, microbatch=microbatch
            )
        finally:
            torch._fused_adamw_ = kernel
        full = fdist.full_params(state.params)
        placements = {k: [str(p) for p in v.placements] for k, v in state.params.items()}
        return {
            "max_error": max_error(full, ref),
            # the step's loss metric is the mean over data-parallel ranks = the global batch's
            "loss_error": ref_losses and max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "names_match": ref is None or sorted(full) == sorted(ref),
            "placements": placements,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "comm": comm,
            "param_bytes": param_bytes(full),
            "fused_calls": len(fused_calls),
        }

    return run


def scenario_global_norm(world):
    """optim.global_norm of sharded gradients equals the norm of the whole gradients."""
    mesh = mesh_for(world)
    gen = torch.Generator().manual_seed(3)
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in make("mlp").named_parameters()}
    expected = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])))
    out = {}
    for plan in ("ddp", "fsdp"):
        model = make("mlp")
        params, _ = fplacement.shard_params(
            model, {k: v.detach() for k, v in model.named_parameters()}, mesh=mesh, plan=plan
        )
        sharded = {
            k: torch.distributed.tensor.distribute_tensor(grads[k], mesh, params[k].placements)
            for k in grads
        }
        out[plan] = {"optim": float(functrain.optim.global_norm(sharded))}
    return {"expected": expected, "norms": out}


def scenario_microbatch(world):
    """Accumulating microbatch gradients locally: one reduction per bucket for the whole batch."""
    mesh = mesh_for(world)
    rank = fmesh.dp_rank(mesh)
    batch = rank_slice(batches("mlp", 1, size=4 * world)[0], rank, world)
    out = {}
    for plan in ("ddp", "fsdp"):
        model = make("mlp")
        params, layout = fplacement.shard_params(
            model, {k: v.detach() for k, v in model.named_parameters()}, mesh=mesh, plan=plan
        )
        leaves = {k: v.detach().requires_grad_() for k, v in params.items()}

        def objective(index, model=model):
            def run(tensors):
                x, y = batch[0][index * 2 : index * 2 + 2], batch[1][index * 2 : index * 2 + 2]
                logits = torch.func.functional_call(model, tensors, (x,))
                return F.cross_entropy(logits, y) * 0.5, None

            return run

        fdist.COUNTER.reset()
        inflight = fdist.InFlight(layout)
        grads, _ = fcompute.accumulate_grads(leaves, [objective(0), objective(1)], layout, inflight)
        calls = dict(fdist.COUNTER.calls)
        grads = fdist.finalize_grads(dict(zip(leaves, grads)), params, layout, inflight)
        # the same gradients from the whole local batch in one pass
        leaves2 = {k: v.detach().requires_grad_() for k, v in params.items()}
        compute = fdist.gather_params(leaves2, layout)
        whole = F.cross_entropy(torch.func.functional_call(model, compute, (batch[0],)), batch[1])
        expected = torch.autograd.grad(whole, list(leaves2.values()))
        err = max(
            float((g.full_tensor() - e.full_tensor()).abs().max())
            for g, e in zip(grads.values(), expected)
        )
        out[plan] = {"calls": calls, "max_error": err}
    return out


def scenario_reshard_memory(world):
    """With reshard_after_forward (on a model built on the meta device), how many modules' whole
    parameters are alive at once: counted whenever a module gathers (forward) and whenever
    autograd gathers again (backward)."""
    from functrain.parallel import reshard

    mesh = mesh_for(world)
    with torch.device("meta"):  # the large-model path: no rank ever holds the model whole
        model = nn.Sequential(*[nn.Linear(9, 9) for _ in range(6)])
    opt = functrain.optim.adamw(1e-2)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=RESHARD)
    step = functrain.make_step(model, lambda m, b: m(b[0]).square().mean(), opt)
    forward, backward = [], []
    gather, unpack = reshard._gather, reshard._unpack

    def live_modules(inflight) -> int:
        alive = {id(e[3][0]) for e in inflight.live.values() if e[0]() is not None}
        return len(alive)

    def counting_gather(inflight, *args):
        forward.append(live_modules(inflight))
        return gather(inflight, *args)

    def counting_unpack(inflight, saved):
        out = unpack(inflight, saved)
        backward.append(len(inflight.regathered))
        return out

    reshard._gather, reshard._unpack = counting_gather, counting_unpack
    try:
        state, _ = step(state, (torch.randn(4, 9),))
    finally:
        reshard._gather, reshard._unpack = gather, unpack
    x = torch.randn(3, 9)
    served = step.call_model(state, x)  # evaluation gathers at use too (under no_grad)
    with torch.no_grad():
        expected = torch.func.functional_call(model, fdist.full_params(state.params), (x,))
    return {
        "forward": forward,
        "backward": backward,
        "eval_error": float((served - expected).abs().max()),
    }


class BorrowsWeight(nn.Module):
    """Uses its child's weight outside the child: not possible when gathering at use."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 6)

    def forward(self, x):
        return F.linear(self.embed(x), self.embed.weight.t())


def scenario_reshard_outside_use(world):
    """A parameter used outside its own module under reshard_after_forward: a clear error."""
    mesh = mesh_for(world)
    model = BorrowsWeight()
    opt = functrain.optim.adamw(1e-2)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=RESHARD)
    step = functrain.make_step(model, lambda m, b: m(b[0]).square().mean(), opt)
    try:
        step(state, (torch.randn(2, 4),))
    except RuntimeError as error:
        return {"error": "\n".join([str(error), *getattr(error, "__notes__", [])])}
    return {"error": None}


def scenario_mixed_precision(world):
    """fsdp(param_dtype=bf16, reduce_dtype=fp32): bf16 on the wire forward, fp32 gradients."""
    ref, _ = on_rank0(reference, "mlp") or (None, None)
    mesh = mesh_for(world)
    plan = fplans.fsdp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    state, losses, comm = train("mlp", mesh, plan)
    full = fdist.full_params(state.params)
    return {
        "max_error": max_error(full, ref),
        "param_dtypes": sorted({str(v.dtype) for v in state.params.values()}),
        "comm": comm,
        "finite": all(math.isfinite(x) for x in losses),
    }


def scenario_meta_init(world):
    """A model built on the meta device: no rank holds it whole, values independent of the mesh."""
    mesh = mesh_for(world)
    with torch.device("meta"):
        model = MLP()
    params = {k: v.detach() for k, v in model.named_parameters()}
    placed, _ = fplacement.shard_params(model, params, mesh=mesh, plan="fsdp", seed=5)
    full = fdist.full_params(placed)
    # the same modules materialised whole on one process with the same seed
    with torch.device("meta"):
        whole = MLP()
    for name, module in whole.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            fplacement._materialize(module, name, torch.device("cpu"), 5)
    expected = dict(whole.named_parameters())
    local_numel = sum(v.to_local().numel() for v in placed.values())
    with torch.device("meta"):
        model2 = MLP()
    state = functrain.init(model2, optimizer(), seed=5, mesh=mesh, plan="fsdp")
    return {
        "max_error": max_error(full, {k: v.detach() for k, v in expected.items()}),
        "local_numel": local_numel,
        "total_numel": sum(v.numel() for v in expected.values()),
        "model_params_are_state": all(
            p.to_local().data_ptr() == state.params[k].to_local().data_ptr()
            for k, p in model2.named_parameters()
        ),
    }


def scenario_buffers_and_eval(world):
    """call_model (evaluation) works under fsdp and gives the single-process outputs."""
    mesh = mesh_for(world)
    ref_model = make("mlp")
    x = batches("mlp", 1)[0][0]
    expected = ref_model(x).detach()
    model = make("mlp")
    state = functrain.init(model, optimizer(), seed=0, mesh=mesh, plan="fsdp")
    step = functrain.make_step(model, classify_loss, optimizer())
    out = step.pieces.call_model(state, x)
    return {"max_error": float((out - expected).abs().max())}


class BNNet(nn.Module):
    """A BatchNorm between two Linear layers: running statistics that each rank's batch moves."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(7, 13)
        self.bn = nn.BatchNorm1d(13)
        self.fc2 = nn.Linear(13, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def scenario_buffers_identical(plan):
    """BatchNorm under `plan`: after every step the running statistics are rank 0's on every
    rank (each rank's own batch moved them apart), so a checkpoint's one copy is every rank's,
    and evaluation (`call_model`) gives the same outputs on every rank."""

    def run(world):
        mesh = mesh_for(world)
        torch.manual_seed(0)
        model = BNNet()
        opt = functrain.optim.sgd(0.1)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
        step = functrain.make_step(model, classify_loss, opt)
        rank, dp = fdist.data_parallel_info(state.layout)
        spread, local = [], []
        for batch in batches("mlp", 3):
            mine = rank_slice(batch, rank, dp)
            mean = mine[0].mean(0)  # each rank's batch differs, so would its statistics
            peers = [torch.empty_like(mean) for _ in range(world)]
            torch.distributed.all_gather(peers, mean)
            local.append(max(float((p - peers[0]).abs().max()) for p in peers))
            state, _ = step(state, mine)
            flat = torch.cat([b.float().reshape(-1) for b in state.buffers.values()])
            every = [torch.empty_like(flat) for _ in range(world)]
            torch.distributed.all_gather(every, flat)
            spread.append(max(float((e - every[0]).abs().max()) for e in every))
        model.eval()  # evaluation normalises with the running statistics
        out = step.pieces.call_model(state, batches("mlp", 1)[0][0]).detach()
        model.train()
        outs = [torch.empty_like(out) for _ in range(world)]
        torch.distributed.all_gather(outs, out)
        moved = float((state.buffers["bn.running_mean"]).abs().max())
        return {
            "buffer_spread": max(spread),
            "local_spread": max(local),
            "eval_spread": max(float((o - outs[0]).abs().max()) for o in outs),
            "moved": moved,
        }

    return run


def scenario_sync_batchnorm(plan):
    """`sync_batchnorm` under `plan`: BatchNorm over the global batch, so N ranks equal one
    process on the global batch (parameters and running statistics), not only each other."""

    def run(world):
        opt = functrain.optim.sgd(0.1)

        def reference_bn():
            torch.manual_seed(0)
            model = BNNet()
            state = functrain.init(model, opt, seed=0, plan="local")
            step = functrain.make_step(model, classify_loss, opt)
            for batch in batches("mlp", 3):
                state, _ = step(state, batch)
            return {**state.params, **state.buffers}

        expected = on_rank0(reference_bn)
        mesh = mesh_for(world)
        torch.manual_seed(0)
        model = fsync.sync_batchnorm(BNNet(), mesh)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
        step = functrain.make_step(model, classify_loss, opt)
        rank, dp = fdist.data_parallel_info(state.layout)
        for batch in batches("mlp", 3):
            state, _ = step(state, rank_slice(batch, rank, dp))
        got = {**fdist.full_params(state.params), **state.buffers}
        return {"max_error": max_error(got, expected), "names": sorted(got)}

    return run


def scenarios_for(world: int) -> dict:
    """The scenarios each world size runs (2 ranks: the broad set; 4: the 2-D meshes)."""
    if world == 4:
        return {
            "ddp": scenario_plan("mlp", "ddp"),
            "fsdp": scenario_plan("mlp", "fsdp"),  # a 5-wide bias on 4 ranks: one empty shard
            "fsdp_fused": scenario_plan("mlp", "fsdp", fused=True),
            "fsdp_reshard": scenario_plan("mlp", RESHARD),
            "tp_fsdp_reshard": scenario_plan(
                "gpt", fplans.tp(shard=True, reshard_after_forward=True), tp=2
            ),
            "hsdp": scenario_plan("mlp", "hsdp", dp_replicate=2),
            "tp_fsdp": scenario_plan("gpt", "tp+fsdp", tp=2),
            "global_norm": scenario_global_norm,
        }
    return {
        "ddp": scenario_plan("mlp", "ddp"),
        "fsdp": scenario_plan("mlp", "fsdp"),
        "ddp_fused": scenario_plan("mlp", "ddp", fused=True),
        "fsdp_fused": scenario_plan("mlp", "fsdp", fused=True),
        "fsdp_reshard": scenario_plan("mlp", RESHARD),
        "fsdp_reshard_fused": scenario_plan("mlp", RESHARD, fused=True),
        "fsdp_reshard_microbatch": scenario_plan("mlp", RESHARD, microbatch=2),
        "tied_fsdp_reshard": scenario_plan("tied", RESHARD),
        "reshard_memory": scenario_reshard_memory,
        "reshard_outside_use": scenario_reshard_outside_use,
        "tied_ddp": scenario_plan("tied", "ddp"),
        "tied_fsdp": scenario_plan("tied", "fsdp"),
        "tp": scenario_plan("gpt", "tp", tp=2),
        "global_norm": scenario_global_norm,
        "microbatch": scenario_microbatch,
        "mixed_precision": scenario_mixed_precision,
        "meta_init": scenario_meta_init,
        "eval": scenario_buffers_and_eval,
        "side_by_side": _value_scenario(value_scenarios.scenario_side_by_side),
        "optimizer_monitor": _value_scenario(value_scenarios.scenario_optimizer_monitor),
        "bn_ddp": scenario_buffers_identical("ddp"),
        "bn_fsdp": scenario_buffers_identical("fsdp"),
        "sync_bn_ddp": scenario_sync_batchnorm("ddp"),
        "sync_bn_fsdp": scenario_sync_batchnorm("fsdp"),
        "nan_monitor": _value_scenario(value_scenarios.scenario_nan_monitor),  # keep last
    }


def _value_scenario(fn):
    """A scenario of value_scenarios.py, given this module's helpers."""
    helpers = dict(
        make=make,
        batches=batches,
        rank_slice=rank_slice,
        classify_loss=classify_loss,
        max_error=max_error,
        mesh_for=mesh_for,
    )
    return lambda world: fn(world, **helpers)


def run_all(world: int, only: list[str] | None = None) -> dict:
    """Run the scenarios for `world` ranks on this rank: `{name: result}`.

    An exception ends the rank (the launcher then stops the others): carrying on would leave the
    ranks in different collectives.
    """
    fdist.init_distributed(timeout_s=120)  # no-op when the process group exists
    results = {}
    for name, fn in scenarios_for(world).items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        results[name] = fn(world)
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    rank, world = fdist.init_distributed(timeout_s=120)
    if world != args.world:
        raise SystemExit(f"expected {args.world} ranks, got {world}")
    results = run_all(world, args.only)
    return finish_worker(rank, args.out, results)


if __name__ == "__main__":
    sys.exit(main())
