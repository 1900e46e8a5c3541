"""What a CPU cannot show: one short run of named checks on one CUDA GPU, printed as one table.

    python -m bench gpu_check              # every check (under 5 minutes on one GPU)
    python -m bench gpu_check --only fsdp_one_rank,cuda_memory_monitor
    python -m bench gpu_check --list       # the checks, one line each

Without CUDA it prints the table with every check skipped and exits 0 (a test runs it so).

Each check is a plain function `check(ctx) -> Result` in `CHECKS`, a list of `Check(name,
description, run)`; add one by appending to it (activation offload, a new kernel, ...). A check
builds what it needs, measures, compares against an independent reference where it can, and
returns what it measured; an exception is reported as a failure of that check alone.

The checks:
    gpt_bf16_eager        the donating step in amp_bf16 on a GPT through `fit`: tokens/s and
                          MFU from SpeedMonitor, and the fused AdamW kernel on the GPU
    gpt_bf16_compiled     the same under compile_step: compile seconds, one graph, speed-up
    microbatch_auto_oom   microbatch_size="auto" under a real CUDA out-of-memory (a memory cap
                          that fits half the batch): it halves, and the step equals an
                          explicit half-batch microbatching
    async_checkpoint      async Manager.save of a CUDA state: the host copies are pinned and
                          queued on the stream (the host blocks no longer than a copy into
                          preallocated pinned buffers), the in-place step after it does not
                          change what is written, and the checkpoint restores exactly
    cuda_memory_monitor   MemoryMonitor's CUDA numbers against torch.cuda's own
    fsdp_one_rank         plan="fsdp" on a 1-rank CUDA mesh equals the same run without a mesh
    activation_memory     checkpointing/offload of activations: the device peak, pinned copies
    fsdp_offload          fsdp(offload=True) on a 1-rank CUDA mesh: the state on the host (pinned)
                          after init and every step, its device memory freed, the plain run's
                          parameters (see bench/gpu_check_offload.py)
    sync_count            synchronising CUDA calls (torch.cuda.set_sync_debug_mode) in fit's
                          steps between log boundaries: on one rank, and per rank under NCCL
                          with the DDP and FSDP plans on 2+ GPUs (see bench/gpu_check_sync.py)
    restore_speed         checkpoint.load of a --restore-mb state from local disk into device
                          memory against the raw read + copy and torch.load, MB/s (see
                          bench/gpu_check_restore.py)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import markdown_table  # noqa: E402
from bench.gpu_check_offload import check_fsdp_offload  # noqa: E402
from bench.gpu_check_restore import check_restore_speed  # noqa: E402
from bench.gpu_check_sync import check_sync_count  # noqa: E402


@dataclasses.dataclass
class Result:
    """What a check measured: `status` "ok", "FAILED" or "skipped", a short `measured` text, a
    `note`, and raw `values` for the JSON."""

    status: str
    measured: str = ""
    note: str = ""
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Check:
    """A named check: `run(ctx) -> Result`."""

    name: str
    description: str
    run: Callable[[argparse.Namespace], Result]


class Capture:
    """A logger keeping every logged value: `values[name] -> [(step, value), ...]`."""

    def __init__(self):
        self.values: dict[str, list[tuple[int, float]]] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.values.setdefault(name, []).append((step, float(value)))

    def last(self, name: str) -> float | None:
        series = self.values.get(name)
        return series[-1][1] if series else None


def ok(condition: bool) -> str:
    return "ok" if condition else "FAILED"


def synchronize(ctx) -> None:
    if ctx.device == "cuda":
        torch.cuda.synchronize()


# -- the GPT ---------------------------------------------------------------------------------------


def gpt_setup(ctx):
    from functrain.models import GPT, GPTConfig

    config = GPTConfig(
        vocab_size=ctx.vocab, block_size=ctx.context, n_layer=ctx.layers, n_head=ctx.heads,
        n_embd=ctx.width, dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config).to(ctx.device)
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (8, ctx.batch, ctx.context + 1), device=ctx.device,
                        generator=gen)  # fmt: skip
    batches = [(x[:, :-1].contiguous(), x[:, 1:].contiguous()) for x in ids]
    params = sum(p.numel() for p in model.parameters())
    # forward + backward: 6 FLOPs per parameter per token, plus attention's 12 * L * d * T
    flops = ctx.context * (6 * params + 12 * config.n_layer * config.n_embd * ctx.context)
    return model, batches, flops


def gpt_loss(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


WARMUP = 3  # untimed steps (the compiled step compiles in the first)


class Clock:
    """Wall-clock stamps at the end of each batch; the warm-up's last waits for the device (no
    other does, so the host keeps running ahead as in a real run)."""

    def __init__(self, ctx):
        self.ctx, self.stamps, self.started = ctx, [], time.perf_counter()

    def fit_start(self, ctx):
        self.started = time.perf_counter()

    def batch_end(self, ctx):
        if len(self.stamps) == WARMUP - 1:
            synchronize(self.ctx)
        self.stamps.append(time.perf_counter())


def train_gpt(ctx, compiled: bool) -> Result:
    import functrain
    from functrain.callbacks import SpeedMonitor

    model, batches, flops = gpt_setup(ctx)
    opt = functrain.optim.adamw(3e-4, weight_decay=0.1)
    step = functrain.make_step(
        model, gpt_loss, opt, precision="amp_bf16", count_tokens=lambda b: b[0].numel()
    )
    if compiled:
        step = functrain.compile_step(step)
    state = functrain.init(model, opt, seed=0)
    fused = []
    kernel = torch._fused_adamw_
    torch._fused_adamw_ = lambda *a, **k: fused.append(1) or kernel(*a, **k)
    torch._dynamo.utils.counters.clear()
    try:
        capture, clock = Capture(), Clock(ctx)
        # The window holds the timed steps only: the first WARMUP (compiling) fall out of it.
        speed = SpeedMonitor(window_size=ctx.steps + 1, flops_per_sample=flops)
        functrain.fit(
            step, state, batches, duration=f"{WARMUP + ctx.steps}ba", callbacks=[clock, speed],
            loggers=[capture], log_interval="1ba", eval_interval=None,
        )  # fmt: skip
    finally:
        torch._fused_adamw_ = kernel
    warm_s = clock.stamps[WARMUP - 1] - clock.started
    tokens = capture.last("throughput/tokens_per_sec")
    mfu = capture.last("throughput/mfu")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    values = {"tokens_per_s": tokens, "mfu": mfu, "warmup_s": warm_s, "fused_calls": len(fused),
              "graphs": graphs}  # fmt: skip
    good = tokens is not None and len(fused) > 0 and (not compiled or graphs == 1)
    measured = f"{tokens or 0:,.0f} tok/s, MFU {100 * (mfu or 0):.1f}%"
    if compiled:
        measured += f", compile+warm-up {warm_s:.0f} s, {graphs} graph(s)"
    return Result(ok(good), measured, f"fused AdamW calls: {len(fused)}", values)


def check_gpt_bf16_eager(ctx) -> Result:
    result = train_gpt(ctx, compiled=False)
    ctx.eager_tokens = result.values.get("tokens_per_s")
    return result


def check_gpt_bf16_compiled(ctx) -> Result:
    result = train_gpt(ctx, compiled=True)
    eager = getattr(ctx, "eager_tokens", None)
    if eager and result.values.get("tokens_per_s"):
        result.note += f"; {result.values['tokens_per_s'] / eager:.2f}x the eager step"
    return result


# -- microbatch_size="auto" under a real out-of-memory ----------------------------------------------


@contextlib.contextmanager
def memory_cap(total_bytes: int):
    """Cap this process's CUDA caching allocator at about `total_bytes` (restored after)."""
    capacity = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, total_bytes / capacity))
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def check_microbatch_auto_oom(ctx) -> Result:
    import functrain
    from functrain.tree import tree_allclose, tree_clone

    width, batch = 4096, 8192

    def build():
        torch.manual_seed(0)
        layers = [torch.nn.Linear(width, width), torch.nn.GELU()] * 2
        return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).cuda()

    def loss_fn(model, b):
        return F.cross_entropy(model(b[0]), b[1])

    gen = torch.Generator(device="cuda").manual_seed(0)
    data = (torch.randn(batch, width, device="cuda", generator=gen),
            torch.randint(0, 10, (batch,), device="cuda", generator=gen))  # fmt: skip
    opt = functrain.optim.sgd(0.1)
    model = build()
    state = functrain.init(model, opt, seed=0)
    # What half the batch needs at its peak, measured: the cap fits that, not the whole batch.
    torch.cuda.reset_peak_memory_stats()
    half = functrain.make_step(model, loss_fn, opt, microbatch_size=batch // 2)
    expected, _ = half(tree_clone(state), data)
    torch.cuda.synchronize()
    need_half = torch.cuda.max_memory_allocated()
    step = functrain.make_step(model, loss_fn, opt, microbatch_size="auto")
    ooms_before = torch.cuda.memory_stats().get("num_ooms", 0)
    with memory_cap(int(need_half * 1.15)):
        new, _ = step(tree_clone(state), data)
        torch.cuda.synchronize()
    ooms = torch.cuda.memory_stats().get("num_ooms", 0) - ooms_before
    chosen = step._microbatch
    same = tree_allclose(new.params, expected.params, atol=1e-5, rtol=1e-4)
    good = ooms >= 1 and chosen is not None and chosen < batch and same
    return Result(
        ok(good),
        f"{batch} -> microbatch {chosen} after {ooms} OOM(s)",
        f"cap {need_half * 1.15 / 2**30:.1f} GiB; equal to an explicit microbatching: {same}",
        {"microbatch": chosen, "ooms": ooms},
    )


# -- async checkpointing from CUDA -----------------------------------------------------------------


def check_async_checkpoint(ctx) -> Result:
    import functrain
    from functrain.checkpoint import Manager
    from functrain.tree import tree_allclose, tree_clone, tree_leaves

    model, batches, _ = gpt_setup(ctx)
    opt = functrain.optim.adamw(3e-4)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, gpt_loss, opt, precision="amp_bf16", donate=True)
    state, _ = step(state, batches[0])
    tensors = [t for t in tree_leaves(state) if isinstance(t, torch.Tensor) and t.is_cuda]
    floor_buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    with tempfile.TemporaryDirectory() as root:
        manager = Manager(root, every="1ba", keep_last=2, async_save=True)
        try:
            manager.save(state, force=True)  # the first save allocates the pinned buffers
            manager.wait()
            state, _ = step(state, batches[1])
            torch.cuda.synchronize()
            started = time.perf_counter()
            for buffer, tensor in zip(floor_buffers, tensors):
                buffer.copy_(tensor, non_blocking=True)
            torch.cuda.synchronize()
            floor = time.perf_counter() - started  # the copy into preallocated pinned buffers
            started = time.perf_counter()
            manager.save(state, force=True)  # queues its copies: the host goes on at once
            blocked = time.perf_counter() - started
            snapshot = tree_clone(state)  # ordered after the copies on the stream
            state, _ = step(state, batches[2])  # updates in place while the write runs
            manager.wait()
            total = time.perf_counter() - started
            pinned = [b.is_pinned() for b in manager._background._buffers.values()]
            restored = manager.restore(snapshot)
        finally:
            manager.close()
    same = restored is not None and tree_allclose(
        {k: v.cpu() for k, v in restored.params.items()},
        {k: v.cpu() for k, v in snapshot.params.items()}, atol=0, rtol=0,
    )  # fmt: skip
    good = bool(pinned) and all(pinned) and same and blocked <= floor
    return Result(
        ok(good),
        f"step blocked {1e3 * blocked:.1f} ms (copy into pinned buffers {1e3 * floor:.1f} ms) "
        f"of a {1e3 * total:.0f} ms save",
        f"{sum(pinned)}/{len(pinned)} host buffers pinned; restored exactly: {same}",
        {"blocked_s": blocked, "floor_s": floor, "total_s": total, "pinned": sum(pinned)},
    )


# -- the CUDA memory monitor -----------------------------------------------------------------------


def check_cuda_memory_monitor(ctx) -> Result:
    import functrain
    from functrain.callbacks import MemoryMonitor

    model, batches, _ = gpt_setup(ctx)
    opt = functrain.optim.adamw(3e-4)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, gpt_loss, opt, precision="amp_bf16")
    capture = Capture()
    torch.cuda.reset_peak_memory_stats()
    functrain.fit(
        step, state, batches, duration="4ba", callbacks=[MemoryMonitor(interval="2ba")],
        loggers=[capture], log_interval="2ba", eval_interval=None,
    )  # fmt: skip
    peak = capture.last("memory/peak_allocated_gib")
    truth = torch.cuda.max_memory_allocated() / 2**30
    reserved = capture.last("memory/reserved_gib")
    good = peak is not None and 0 < peak <= truth * 1.0001 and reserved is not None
    return Result(
        ok(good),
        f"peak {peak or 0:.2f} GiB (torch.cuda: {truth:.2f}), reserved {reserved or 0:.2f} GiB",
        f"keys: {len([k for k in capture.values if k.startswith('memory/')])}",
        {"peak_gib": peak, "torch_peak_gib": truth},
    )


# -- FSDP on a 1-rank mesh -------------------------------------------------------------------------


def check_fsdp_one_rank(ctx) -> Result:
    import functrain
    from functrain import parallel
    from functrain.tree import tree_allclose

    def run(mesh):
        model, batches, _ = gpt_setup(ctx)
        opt = functrain.optim.chain(
            functrain.optim.clip_by_global_norm(1.0), functrain.optim.adamw(3e-4)
        )
        kwargs = {"mesh": mesh, "plan": "fsdp"} if mesh is not None else {}
        state = functrain.init(model, opt, seed=0, **kwargs)
        step = functrain.make_step(model, gpt_loss, opt, precision="amp_bf16", donate=True)
        synchronize(ctx)
        started = time.perf_counter()
        for batch in batches[:4]:
            state, metrics = step(state, batch)
        synchronize(ctx)
        seconds = (time.perf_counter() - started) / 4
        return parallel.full_params(state.params) if mesh is not None else state.params, seconds

    mesh = parallel.init_mesh(dp_shard=1, device_type=ctx.device)
    sharded, sharded_s = run(mesh)  # the mesh lives in the state's layout, not in the process
    local, local_s = run(None)
    same = tree_allclose(sharded, local, atol=2e-3, rtol=2e-2)  # bf16 compute
    return Result(
        ok(same),
        f"{1e3 * sharded_s:.1f} ms/step on the mesh, {1e3 * local_s:.1f} ms without",
        f"equal to the run without a mesh: {same}",
        {"mesh_ms": 1e3 * sharded_s, "local_ms": 1e3 * local_s},
    )


# -- activation checkpointing and offload ---------------------------------------------------------


def check_activation_memory(ctx) -> Result:
    """The real device peak of a step with no checkpointing, full, selective and offload; each
    trains to the same parameters (bf16 tolerance); offload's host copies are pinned."""
    if ctx.device != "cuda":
        return Result("skipped", note="needs CUDA (the saving is on the device)")
    import functrain
    from functrain.algorithms import activation_checkpointing, activation_offload
    from functrain.tree import tree_allclose

    offload_impl = importlib.import_module("functrain.algorithms.activation_offload")
    pinned = []
    pack = offload_impl._pack

    def spying_pack(*args):
        packed = pack(*args)
        if packed[0] == "host":
            pinned.append(packed[2].is_pinned())
        return packed

    variants = {
        "none": [],
        "full": [activation_checkpointing("Block")],
        "selective": [activation_checkpointing("Block", policy="selective")],
        "offload": [activation_offload("Block")],
    }
    results, params = {}, {}
    offload_impl._pack = spying_pack
    try:
        for name, algorithms in variants.items():
            model, batches, _ = gpt_setup(ctx)
            opt = functrain.optim.adamw(3e-4)
            state = functrain.init(model, opt, seed=0)
            step = functrain.compose(
                functrain.make_step(model, gpt_loss, opt, precision="amp_bf16"), *algorithms
            )
            state, _ = step(state, batches[0])  # warm-up: the optimizer state exists
            synchronize(ctx)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            started = time.perf_counter()
            for batch in batches[1:4]:
                state, _ = step(state, batch)
            synchronize(ctx)
            results[name] = {
                "peak_above_state_gib": (torch.cuda.max_memory_allocated() - base) / 2**30,
                "ms": 1e3 * (time.perf_counter() - started) / 3,
            }
            params[name] = {k: v.float() for k, v in state.params.items()}
            del model, state, step
            torch.cuda.empty_cache()
    finally:
        offload_impl._pack = pack
    same = all(tree_allclose(params[n], params["none"], atol=2e-3, rtol=2e-2) for n in variants)
    peaks = {n: r["peak_above_state_gib"] for n, r in results.items()}
    good = (
        same
        and peaks["full"] < peaks["selective"] < peaks["none"]
        and peaks["offload"] < peaks["none"]
        and pinned
        and all(pinned)
    )
    measured = ", ".join(
        f"{n} {r['peak_above_state_gib']:.2f} GiB {r['ms'] / results['none']['ms']:.2f}x"
        for n, r in results.items()
    )
    return Result(
        ok(good),
        measured,
        f"same params: {same}; pinned host copies: {len(pinned)} (all pinned: {all(pinned)})",
        results,
    )


CHECKS: list[Check] = [
    Check("gpt_bf16_eager", "the step in amp_bf16 on a GPT: tokens/s, MFU", check_gpt_bf16_eager),
    Check("gpt_bf16_compiled", "the same under compile_step", check_gpt_bf16_compiled),
    Check("microbatch_auto_oom", 'microbatch_size="auto" halves on a real OOM',
          check_microbatch_auto_oom),
    Check("async_checkpoint", "async save from CUDA: pinned copies, short block",
          check_async_checkpoint),
    Check("cuda_memory_monitor", "MemoryMonitor against torch.cuda", check_cuda_memory_monitor),
    Check("fsdp_one_rank", "plan='fsdp' on a 1-rank CUDA mesh", check_fsdp_one_rank),
    Check("activation_memory", "checkpointing/offload: device peak, pinned copies, same params",
          check_activation_memory),
    Check("fsdp_offload", "fsdp(offload=True): state pinned on the host, device memory freed",
          check_fsdp_offload),
    Check("sync_count", "fit's syncs between log boundaries: one rank, NCCL DDP/FSDP per rank",
          check_sync_count),
    Check("restore_speed", "checkpoint.load from local disk into the device vs raw read, torch",
          check_restore_speed),
]  # fmt: skip


# -- the driver ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", help="comma-separated check names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--steps", type=int, default=20, help="timed GPT steps")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--restore-mb", type=float, default=1024, help="restore_speed's state")
    parser.add_argument("--restore-reps", type=int, default=5, help="restore_speed's repetitions")
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda; 'cpu' runs the checks that can run there (gpt_bf16_*, fsdp_*) as a "
        "dry run of this script itself, with small --layers/--width/--context",
    )
    return parser.parse_args(argv)


def run_checks(ctx: argparse.Namespace, checks: Sequence[Check]) -> list[tuple[Check, Result]]:
    """Run each check in turn (a failure is reported, the others still run)."""
    results = []
    for check in checks:
        if ctx.device == "cuda" and not torch.cuda.is_available():
            results.append((check, Result("skipped", note="no CUDA device")))
            continue
        started = time.perf_counter()
        try:
            result = check.run(ctx)
        except Exception as error:  # reported in the table, the other checks still run
            result = Result("FAILED", note=f"{type(error).__name__}: {error}"[:200])
        result.seconds = time.perf_counter() - started
        results.append((check, result))
        print(
            f"[gpu_check] {check.name}: {result.status} ({result.seconds:.0f} s)", file=sys.stderr
        )
    return results


def table(results: list[tuple[Check, Result]]) -> str:
    rows = [
        [c.name, r.status, f"{r.seconds:.0f}" if r.status != "skipped" else "–", r.measured, r.note]
        for c, r in results
    ]
    return markdown_table(["check", "status", "s", "measured", "note"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench gpu_check`: run the checks, print one table; 1 if any failed."""
    ctx = parse_args(argv)
    names = {c.name: c for c in CHECKS}
    if ctx.list:
        for c in CHECKS:
            print(f"{c.name:22} {c.description}")
        return 0
    chosen = CHECKS
    if ctx.only:
        wanted = [n.strip() for n in ctx.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"unknown check(s) {unknown}; choose from {', '.join(names)}", file=sys.stderr)
            return 2
        chosen = [names[n] for n in wanted]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    print(f"gpu_check on {device}, torch {torch.__version__}")
    results = run_checks(ctx, chosen)
    print(table(results))
    return 1 if any(r.status == "FAILED" for _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
