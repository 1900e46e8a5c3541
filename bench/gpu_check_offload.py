"""The `fsdp_offload` check of `python -m bench gpu_check`: `fsdp(offload=True)` on a 1-rank mesh.

What only a GPU shows: after `init` and after every step the state's shards are on the host
(parameters pinned, so their copies to the device are asynchronous), the device holds none of the
parameters or the optimizer state between steps (its memory against the plain fsdp run's), the
trained parameters equal the plain run's (bf16 tolerance: the host runs the optimizer with the
CPU kernel), a pure step and an optimizer without a fused form (the transforms' foreach path)
keep the state on the host, and a checkpoint restores into pinned host shards.

With `--device cpu` it runs as a dry run of itself (the host is the device: nothing to pin, no
device memory to read), so a CPU test keeps the script working.
"""

from __future__ import annotations

import tempfile
import time

import torch


def _where(state) -> dict:
    from functrain.tree import tree_leaves

    params = [v.to_local() for v in state.params.values()]
    opt = [x.to_local() for x in tree_leaves(state.opt_state) if hasattr(x, "to_local")]
    return {
        "devices": sorted({str(t.device) for t in params + opt}),
        "params_pinned": all(t.is_pinned() for t in params),
    }


def _resident(ctx, base: int) -> int:
    """Device bytes allocated above `base` (0 on the CPU dry run)."""
    if ctx.device != "cuda":
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - base


def check_fsdp_offload(ctx):
    import functrain
    from bench.gpu_check import Result, gpt_loss, gpt_setup, ok, synchronize
    from functrain import checkpoint, parallel
    from functrain.parallel import plans
    from functrain.tree import tree_allclose

    cuda = ctx.device == "cuda"
    mesh = parallel.init_mesh(dp_shard=1, device_type=ctx.device)

    def run(offload: bool, donate: bool = True, opt=None, steps: int = 3):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        model, batches, _ = gpt_setup(ctx)
        batch_bytes = sum(t.numel() * t.element_size() for b in batches for t in b)
        opt = opt or functrain.optim.chain(
            functrain.optim.clip_by_global_norm(1.0), functrain.optim.adamw(3e-4)
        )
        plan = plans.fsdp(offload=offload)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
        after_init = _resident(ctx, base + batch_bytes)
        if cuda:  # the model was whole on the device until init placed it: not the step's peak
            torch.cuda.reset_peak_memory_stats()
        step = functrain.make_step(model, gpt_loss, opt, precision="amp_bf16", donate=donate)
        state, _ = step(state, batches[0])  # warm-up
        synchronize(ctx)
        started = time.perf_counter()
        for batch in batches[1:steps]:
            state, _ = step(state, batch)
        synchronize(ctx)
        seconds = (time.perf_counter() - started) / max(1, steps - 1)
        out = {
            "state": state,
            "step": step,
            "model": model,
            "params": parallel.full_params(state.params),
            "where": _where(state),
            "init_resident": after_init,
            "resident": _resident(ctx, base + batch_bytes),  # the state, between steps
            "peak": (torch.cuda.max_memory_allocated() - base) if cuda else 0,
            "ms": 1e3 * seconds,
        }
        return out

    off, plain = run(True), run(False)
    param_bytes = sum(v.numel() * v.element_size() for v in off["params"].values())
    host = off["where"]["devices"] == ["cpu"]
    pinned = off["where"]["params_pinned"] or not cuda
    same = tree_allclose(
        {k: v.float().cpu() for k, v in off["params"].items()},
        {k: v.float().cpu() for k, v in plain["params"].items()},
        atol=2e-3,
        rtol=2e-2,
    )
    # between steps the device holds (almost) nothing of the offloaded state; the plain state
    # holds the parameters and Adam's two moments there
    freed = not cuda or (
        off["resident"] < 0.05 * plain["resident"] and plain["resident"] >= 2 * param_bytes
    )
    pure = run(True, donate=False, steps=2)
    unfused = run(
        True,
        opt=functrain.optim.chain(
            functrain.optim.clip_by_value(1.0), functrain.optim.sgd(1e-3, momentum=0.9)
        ),
        steps=2,
    )
    others_host = pure["where"]["devices"] == ["cpu"] and unfused["where"]["devices"] == ["cpu"]
    with tempfile.TemporaryDirectory() as root:
        checkpoint.save(f"{root}/c", off["state"])
        like = functrain.init(
            gpt_setup(ctx)[0],
            off["step"].optimizer,
            seed=1,
            mesh=mesh,
            plan=off["state"].layout.plan,
        )
        restored = checkpoint.load(f"{root}/c", like=like)
    restored_where = _where(restored)
    restored_ok = (
        restored_where["devices"] == ["cpu"]
        and (restored_where["params_pinned"] or not cuda)
        and all(
            torch.equal(a, b)
            for a, b in zip(parallel.full_params(restored.params).values(), off["params"].values())
        )
    )
    good = host and pinned and same and freed and others_host and restored_ok
    gib = 2**30
    measured = (
        f"state on device between steps: {off['resident'] / gib:.2f} GiB offloaded vs "
        f"{plain['resident'] / gib:.2f} GiB plain; step peak {off['peak'] / gib:.2f} vs "
        f"{plain['peak'] / gib:.2f} GiB; {off['ms']:.0f} vs {plain['ms']:.0f} ms/step "
        f"({off['ms'] / plain['ms']:.2f}x)"
    )
    note = (
        f"host: {host}, pinned: {pinned}, same params: {same}, freed: {freed}, pure/unfused on "
        f"host: {others_host}, restored pinned on host: {restored_ok}"
    )
    values = {
        k: {n: r[n] for n in ("init_resident", "resident", "peak", "ms")}
        for k, r in (("offload", off), ("plain", plain))
    }
    return Result(ok(good), measured, note, values)
