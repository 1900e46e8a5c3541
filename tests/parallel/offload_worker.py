"""`fsdp(offload=True)` on N ranks (gloo): offloaded runs against the same runs without offload.

Launched as `python -m functrain.launch -n 2 tests/parallel/offload_worker.py --out r.json
--dir DIR`; rank 0 writes the results as JSON for tests/parallel/test_parallel_offload.py.
Every rank computes the single-process reference (no mesh) on the global batch itself, so that
comparison needs no communication.
"""

from __future__ import annotations

import argparse
import sys

import torch
from parallel_launching import finish_worker

import functrain
from functrain import parallel as fdist
from functrain.checkpoint import Manager
from functrain.models.gpt import GPT, GPTConfig, gpt_loss
from functrain.parallel import plans as fplans
from functrain.state import trainable_names
from functrain.tree import tree_leaves

STEPS = 3
BATCH = 4


def model(dropout=0.0, frozen=False) -> GPT:
    torch.manual_seed(0)
    net = GPT(GPTConfig(vocab_size=29, block_size=8, n_layer=2, n_head=2, n_embd=12,
                        dropout=dropout))  # fmt: skip
    if frozen:  # a frozen parameter is gathered from its host shard too, and never updated
        net.blocks[0].ln1.weight.requires_grad_(False)
    return net


def batches(steps=STEPS):
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, 29, (BATCH, 8), generator=g),
            torch.randint(0, 29, (BATCH, 8), generator=g),
        )
        for _ in range(steps)
    ]


def adamw():  # a small lr: Adam's normalised step amplifies float rounding (vs one process)
    return functrain.optim.adamw(1e-3, weight_decay=0.1)


# name -> (plan options, make_step options, optimizer, model options)
VARIANTS = {
    "fsdp": ({}, {}, adamw, {}),
    "reshard": ({"reshard_after_forward": True}, {}, adamw, {}),
    "microbatch": ({}, {"microbatch_size": 1}, adamw, {}),
    "pure_step": ({}, {"donate": False}, adamw, {}),
    "clip_host_norm": (
        {},
        {},
        lambda: functrain.optim.chain(functrain.optim.clip_by_global_norm(0.05), adamw()),
        {},
    ),
    "unfused_sgd": (  # clip_by_value has no fused form: the transforms' own foreach path
        {},
        {},
        lambda: functrain.optim.chain(
            functrain.optim.clip_by_value(0.01), functrain.optim.sgd(0.1, momentum=0.9)
        ),
        {},
    ),
    "frozen": ({}, {}, adamw, {"frozen": True}),
    "dropout": ({}, {}, adamw, {"dropout": 0.1}),
    "amp_bf16": ({"reshard_after_forward": True}, {"precision": "amp_bf16"}, adamw, {}),
    "param_dtype_bf16": (
        {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32},
        {},
        adamw,
        {},
    ),  # fmt: skip
}


def local_bytes(tree) -> int:
    return sum(x.to_local().numel() * x.to_local().element_size() for x in tree.values())


def run(variant: str, mesh=None, offload=False) -> dict:
    plan_options, step_options, make_opt, model_options = VARIANTS[variant]
    net = model(**model_options)
    opt = make_opt()
    if mesh is None:
        state = functrain.init(net, opt, seed=0, plan="local")
    else:
        plan = fplans.fsdp(offload=offload, **plan_options)
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=plan)
    step = functrain.make_step(net, gpt_loss, opt, **{"donate": True, **step_options})
    rank, world = fdist.data_parallel_info(state.layout)
    per = BATCH // world
    counts = []
    for x, y in batches():
        before = fdist.COUNTER.snapshot()["payload_bytes"]
        state, _ = step(state, (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]))
        after = fdist.COUNTER.snapshot()["payload_bytes"]
        counts.append({k: after.get(k, 0) - before.get(k, 0) for k in ("host_to_device",
                                                                       "device_to_host")})  # fmt: skip
    out = {"state": state, "counts": counts, "trainable": trainable_names(net)}
    if mesh is not None:
        out["params"] = fdist.full_params(state.params)
        out["opt"] = [x.full_tensor() if hasattr(x, "full_tensor") else x
                      for x in tree_leaves(state.opt_state) if isinstance(x, torch.Tensor)]  # fmt: skip
    else:
        out["params"] = dict(state.params)
    return out


def max_error(a, b) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def identical(a: dict, b: dict) -> bool:
    return (
        all(torch.equal(a["params"][k], b["params"][k]) for k in b["params"])
        and len(a["opt"]) == len(b["opt"])
        and all(torch.equal(x, y) for x, y in zip(a["opt"], b["opt"]))
    )


def where(state) -> dict:
    """The devices of the state's local pieces, and what the layout's policies say."""
    params = {str(v.to_local().device) for v in state.params.values()}
    opt = {str(x.to_local().device) for x in tree_leaves(state.opt_state) if hasattr(x, "to_local")}
    policies = {p.offload for _, p in state.layout.policies}
    return {"params": sorted(params), "opt": sorted(opt), "offload": sorted(policies)}


def compare(mesh, replicas) -> dict:
    """Each variant offloaded and not; "replicas" is "fsdp" on a mesh of 2 replicas of one
    shard (hsdp's replicate dim: whole tensors, gradients all-reduced)."""
    results = {}
    for name in [*VARIANTS, "replicas"]:
        on_mesh = replicas if name == "replicas" else mesh
        name = "fsdp" if name == "replicas" else name
        off, on = run(name, on_mesh, offload=True), run(name, on_mesh, offload=False)
        name = "replicas" if on_mesh is replicas else name
        state = off["state"]
        trainable = {k: state.params[k] for k in off["trainable"]}
        results[name] = {
            "identical": identical(off, on),
            "max_error": max_error(off["params"], on["params"]),
            "where": where(state),
            # every step copies every local shard to the device and the trainable ones' gradients
            # back; without offload, nothing
            "h2d_ok": all(c["host_to_device"] == local_bytes(state.params) for c in off["counts"]),
            "d2h_ok": all(c["device_to_host"] == local_bytes(trainable) for c in off["counts"]),
            "none_without": all(not any(c.values()) for c in on["counts"]),
        }
        if name in ("fsdp", "reshard", "microbatch", "clip_host_norm", "unfused_sgd", "frozen"):
            results[name]["vs_one_process"] = max_error(off["params"], run(name)["params"])
        if name == "replicas":
            results[name]["vs_one_process"] = max_error(off["params"], run("fsdp")["params"])
    return results


# -- fit, checkpoints and auto-resume -------------------------------------------------------------


def fit_runs(mesh, root) -> dict:
    """fit under fsdp(reshard_after_forward=True, offload=...), microbatches of 1, amp_bf16 and
    dropout: uninterrupted, and crashed after the checkpoint at batch 4 and resumed, the resumed
    run possibly under the other layout (checkpoints do not depend on it)."""

    def build(offload):
        net = model(dropout=0.1)
        opt = adamw()
        plan = fplans.fsdp(reshard_after_forward=True, offload=offload)
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=plan)
        step = functrain.make_step(net, gpt_loss, opt, microbatch_size=1, precision="amp_bf16")
        x = torch.cat([b[0] for b in batches(3)])
        y = torch.cat([b[1] for b in batches(3)])
        data = functrain.data.Loader(torch.utils.data.TensorDataset(x, y), 4, seed=2)
        return step, state, data

    class CrashAt:  # every rank fails at batch 5, after the save at batch 4
        def batch_end(self, ctx):
            if ctx.timestamp.batch == 5:
                raise RuntimeError("simulated crash")

    def whole(offload):
        step, state, data = build(offload)
        return functrain.fit(step, state, data, duration="6ba", progress=False)

    def crashed_then_resumed(saved_offload, resumed_offload, directory):
        step, state, data = build(saved_offload)
        with Manager(f"{root}/{directory}", every="2ba", async_save=False) as manager:
            try:
                functrain.fit(step, state, data, duration="6ba", checkpoints=manager,
                              callbacks=[CrashAt()], progress=False)  # fmt: skip
                raise AssertionError("the simulated crash did not happen")
            except functrain.CallbackError:
                pass
        step, state, data = build(resumed_offload)
        with Manager(f"{root}/{directory}", every="2ba", async_save=False) as manager:
            return functrain.fit(step, state, data, duration="6ba", checkpoints=manager,
                                 autoresume=True, return_result=True, progress=False)  # fmt: skip

    def same(a, b) -> bool:
        a, b = fdist.full_params(a.params), fdist.full_params(b.params)
        return all(torch.equal(a[k], b[k]) for k in a)

    on, off = whole(True), whole(False)
    out = {"offload_equals_plain": same(on, off), "where": where(on)}
    for saved, resumed, name in (
        (True, True, "offload_to_offload"),
        (False, True, "plain_to_offload"),
        (True, False, "offload_to_plain"),
    ):
        result = crashed_then_resumed(saved, resumed, name)
        reference = on if resumed else off
        out[name] = {
            "resumed_from": result.resumed_from,
            "identical": same(result.state, reference),
            "offloaded": result.state.layout.offloaded,
            "where": where(result.state),
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    rank, world = fdist.init_distributed(timeout_s=120)
    mesh = fdist.init_mesh(dp_shard=-1)
    replicas = fdist.init_mesh(dp_shard=1, dp_replicate=-1) if world > 1 else mesh
    results = {"world": world, "variants": compare(mesh, replicas)}
    results["fit"] = fit_runs(mesh, args.dir)
    return finish_worker(rank, args.out, results)


if __name__ == "__main__":
    sys.exit(main())
