"""`python -m bench memory --activations`: activation checkpointing on the GPT, side by side.

Variants, all on the same GPT (4+ blocks, a sequence length where activations dominate):
`none` (no checkpointing), `full` (every block), `every2` (every 2nd block), `selective` (keep
matmul and attention outputs, recompute the rest) — all `functrain.algorithms.
activation_checkpointing` — and `by_hand`: the same model with `torch.utils.checkpoint` applied
to each block in its forward, as a user would without functrain.

Per variant:
- held_mib: bytes of activations alive at the end of the forward pass
  (`bench.held_activations.held_activation_bytes`: what backward needs; includes
  selective checkpointing's saved outputs, which no saved-tensor hook sees);
- saved_mib: bytes autograd packs through `saved_tensors_hooks` (parameters excluded);
- peak_mib: the process's peak torch allocation over a step (`bench.common.
  peak_allocated_bytes`, CPU profiler; on CUDA `max_memory_allocated`);
- step time: median over interleaved repetitions (variants in turn, the order reversed every
  other rep), and the median of per-repetition ratios to `none`; by this process's CPU time on
  one thread by default (steady on a loaded machine), wall time on CUDA.
Goals (issue 16): full cuts held activations by >= 70% at <= 1.35x step time; selective keeps
>= 40% of full's saving at <= 1.15x.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
from torch.utils import checkpoint as torch_checkpoint

import functrain
from bench.held_activations import held_activation_bytes
from functrain.algorithms import activation_checkpointing
from functrain.models.gpt import GPT, GPTConfig, gpt_loss

from . import common

VARIANTS = ("none", "full", "every2", "selective", "by_hand")


class HandCheckpointedGPT(GPT):
    """The GPT with `torch.utils.checkpoint` around each block, written into its forward."""

    def forward(self, idx):
        length = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(length, device=idx.device))
        x = self.drop(x)
        for block in self.blocks:
            x = torch_checkpoint.checkpoint(block, x, use_reentrant=False)
        return self.lm_head(self.ln_f(x))


def algorithm_for(variant: str):
    return {
        "full": lambda: activation_checkpointing("Block"),
        "every2": lambda: activation_checkpointing("Block", every=2),
        "selective": lambda: activation_checkpointing("Block", policy="selective"),
    }.get(variant, lambda: None)()


def build(variant: str, config: GPTConfig, device: str):
    torch.manual_seed(0)
    model = (HandCheckpointedGPT if variant == "by_hand" else GPT)(config).to(device)
    opt = functrain.optim.adamw(1e-3)
    step = functrain.make_step(model, gpt_loss, opt, donate=True)
    algorithm = algorithm_for(variant)
    if algorithm is not None:
        step = functrain.compose(step, algorithm)
    return step, functrain.init(model, opt, seed=0)


def saved_bytes(step, state, batch) -> int:
    seen, total = set(), [0]

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if not (t.is_leaf and t.requires_grad) and key not in seen:
            seen.add(key)
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step.pieces.grads(step.pieces, state, batch)
    return total[0]


def peak_bytes(variant, config, batch, device) -> int:
    if device.startswith("cuda"):
        step, state = build(variant, config, device)
        state, _ = step(state, batch)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        state, _ = step(state, batch)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    holder = {}

    def make():
        step, state = build(variant, config, device)
        holder["state"] = state

        def run(n):
            for _ in range(n):
                holder["state"], _ = step(holder["state"], batch)
            return [time.perf_counter()] * n

        return common.Runner(variant, run)

    return common.peak_allocated_bytes(make, warmup=1, steps=1)["peak_bytes"]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench memory --activations")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant and rep")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="this process's CPU time (default: steady on a shared machine; 1 thread) or wall",
    )
    parser.add_argument("--threads", type=int, help="torch threads (default 1 with --clock cpu)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.argv = argv
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.device.startswith("cuda"):
        args.clock = "wall"  # the device's time is not this process's CPU time
    threads = args.threads or (1 if args.clock == "cpu" else None)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(before)  # a caller in this process (a test) keeps its threads


def _run(args) -> dict:
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    started = time.perf_counter()
    config = GPTConfig(vocab_size=256, block_size=args.length, n_layer=args.layers,
                       n_head=args.heads, n_embd=args.width)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    batch = tuple(
        torch.randint(0, 256, (args.batch, args.length), generator=g).to(args.device)
        for _ in range(2)
    )
    rows: dict[str, dict] = {}
    for variant in args.variants:
        common.log(f"[activations] {variant}: memory")
        step, state = build(variant, config, args.device)
        rows[variant] = {
            "held_bytes": held_activation_bytes(step, state, batch),
            "saved_bytes": saved_bytes(step, state, batch),
            "peak_bytes": peak_bytes(variant, config, batch, args.device),
            "times": [],
        }
    runners = {v: build(v, config, args.device) for v in args.variants}
    for variant, (step, state) in runners.items():  # warm up every variant once
        runners[variant] = (step, step(state, batch)[0])
    for rep in range(args.reps):
        order = args.variants if rep % 2 == 0 else args.variants[::-1]
        for variant in order:
            step, state = runners[variant]
            begin = clock()
            for _ in range(args.steps):
                state, metrics = step(state, batch)
            float(metrics["loss"])  # wait for the device
            rows[variant]["times"].append((clock() - begin) / args.steps)
            runners[variant] = (step, state)
    base = rows.get("none")
    for row in rows.values():
        row["step_ms"] = 1e3 * statistics.median(row["times"])
        if base is not None:
            row["time_ratio"] = statistics.median(
                t / b for t, b in zip(row["times"], base["times"])
            )
            row["held_cut"] = 1 - row["held_bytes"] / base["held_bytes"]
    report = common.new_report(
        "memory_activations",
        args.argv,
        config={k: v for k, v in vars(args).items() if k != "argv"},
        rows=rows,
        goals=goals(rows),
    )
    report["total_s"] = time.perf_counter() - started
    path = common.write_json(args.out or f"{common.RESULTS_DIR}/memory_activations.json", report)
    print(table(rows))
    print()
    for goal in report["goals"]:
        print(f"{'PASS' if goal['holds'] else 'MISS'}  {goal['goal']}: {goal['measured']}")
    print(f"\n{report['total_s']:.0f} s in all; JSON written to {path}")
    return report


def goals(rows: dict) -> list[dict]:
    out = []
    full, selective = rows.get("full"), rows.get("selective")
    if full and "held_cut" in full:
        out.append({
            "goal": "full: held activations cut >= 70% at <= 1.35x step time",
            "measured": f"cut {full['held_cut']:.0%}, {full['time_ratio']:.2f}x",
            "holds": full["held_cut"] >= 0.70 and full["time_ratio"] <= 1.35,
        })  # fmt: skip
    if full and selective and "held_cut" in selective and full["held_cut"] > 0:
        share = selective["held_cut"] / full["held_cut"]
        out.append({
            "goal": "selective: >= 40% of full's saving at <= 1.15x step time",
            "measured": f"{share:.0%} of full's saving, {selective['time_ratio']:.2f}x",
            "holds": share >= 0.40 and selective["time_ratio"] <= 1.15,
        })  # fmt: skip
    return out


def table(rows: dict) -> str:
    lines = [
        f"{'variant':<10} {'held MiB':>9} {'cut':>6} {'saved MiB':>10} {'peak MiB':>9} "
        f"{'step ms':>8} {'x none':>7}"
    ]
    for variant, row in rows.items():
        cut = f"{row['held_cut']:.0%}" if "held_cut" in row else "-"
        ratio = f"{row['time_ratio']:.2f}" if "time_ratio" in row else "-"
        lines.append(
            f"{variant:<10} {row['held_bytes'] / 2**20:>9.1f} {cut:>6} "
            f"{row['saved_bytes'] / 2**20:>10.1f} {row['peak_bytes'] / 2**20:>9.1f} "
            f"{row['step_ms']:>8.1f} {ratio:>7}"
        )
    return "\n".join(lines)
