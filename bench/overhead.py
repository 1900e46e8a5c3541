"""Step overhead and peak memory: functrain against a hand-written PyTorch loop and peer trainers.

Four models (a tiny MLP whose step is well under a millisecond, so fixed per-step costs dominate;
an MLP; a small ResNet-style CNN; a small GPT) train with AdamW under every variant:

    torch               the hand-written eager loop, torch.optim.AdamW default (a per-tensor loop on CPU)
    torch_fused         the same loop with AdamW(fused=True)
    functrain_pure      functrain's default step (pure: the input state is left untouched)
    functrain           functrain's donating step (what `fit` runs) in a plain Python loop
    functrain_fit       the same step driven by `functrain.fit` (no loggers, no checkpoints)
    torch_chain         the loop with clip_grad_norm_, AdamW(fused=True) without decay on biases,
                        and a cosine LambdaLR
    functrain_chain     the pure step with chain(clip_by_global_norm(1.0), adamw(lr=1e-3 *
                        cosine, weight_decay_mask=no_decay_mask)) (ratio to the plain floor)
    torch_compiled      torch.compile(model) + eager AdamW(fused=True): "compiling the model alone"
    torch_compiled_opt  torch.compile(model) + a compiled AdamW step: the compile-time reference
    functrain_compiled  compile_step
    composer, lightning           peer Trainers with progress bars and logging off
    composer_defaults, lightning_defaults   the same Trainers with their defaults

The floor (ratio 1.00) is the faster (lower median) of `torch` and `torch_fused`, so an optimizer
kernel's gain never passes for low trainer overhead. Ratios are taken against the floor's time in
the same repetition; bench/README.md describes the method, the clock and the memory measurement.

A start-up row comes first: `import functrain` against `import torch` in fresh processes,
interleaved (bench/import_time.py); `--only import` runs just that row, `--only steps` skips it.

Usage:
    python -m bench overhead [--models tiny_mlp,gpt] [--variants torch,functrain] [--reps 5]
    python -m bench overhead --only import [--import-reps 15]
    python -m bench memory   [--models ...] [--variants ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import common, import_time, peers
from .models import Batches, ModelSpec, model_specs

LR, WEIGHT_DECAY = 1e-3, 1e-2
BASELINE = ("torch", "torch_fused")
VARIANTS = {
    "torch": "hand-written loop, AdamW (default)",
    "torch_fused": "hand-written loop, AdamW(fused=True)",
    "functrain_pure": "functrain's default step (pure: the input state is untouched), eager",
    "functrain": "functrain step (donating), eager",
    "functrain_fit": "functrain.fit, eager",
    "torch_chain": "hand-written loop, clip_grad_norm_ + AdamW(fused=True) in two groups "
    "(no decay on biases) + a cosine LambdaLR",
    "functrain_chain": "functrain's pure step, chain(clip_by_global_norm(1.0), adamw(cosine lr, "
    "weight_decay_mask=no_decay_mask))",
    "functrain_chain_donate": "the same chain in functrain's donating step (what fit runs)",
    "torch_compiled": "torch.compile(model) + AdamW(fused=True)",
    "torch_compiled_opt": "torch.compile(model) + a torch.compile'd AdamW step (tensor lr)",
    "functrain_compiled": "functrain compile_step",
    "composer": "Composer Trainer, progress bar and logging off",
    "composer_defaults": "Composer Trainer, defaults",
    "lightning": "Lightning Trainer, progress bar and logging off",
    "lightning_defaults": "Lightning Trainer, defaults",
}
COMPILED = ("torch_compiled", "torch_compiled_opt", "functrain_compiled")
# The chain variants' schedule: a 10-batch warm-up, then a cosine over a long run.
WARMUP, HORIZON = 10, 100_000


def cosine_multiplier(batch: int) -> float:
    """The chain variants' lr multiplier at `batch` (what functrain's schedule computes)."""
    if batch < WARMUP:
        return batch / WARMUP
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (batch - WARMUP) / (HORIZON - WARMUP))))


# ------------------------------------------------------------------------------------------------
# variants


def _torch_adamw(params, fused: bool | None) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=fused)


def _hand_written(
    spec, data, device, now, *, fused: bool, compile_model: bool, chain=False, compile_opt=False
) -> common.Runner:
    model = spec.build().to(device)
    if chain:  # what functrain_chain computes, written the usual PyTorch way
        groups = [
            {"params": [p for p in model.parameters() if p.ndim > 1]},
            {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, cosine_multiplier)
    elif compile_opt:  # a tensor lr, so the compiled step does not recompile when it changes
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(LR), weight_decay=WEIGHT_DECAY)
    else:
        opt = _torch_adamw(model.parameters(), fused=True if fused else None)
    forward = torch.compile(model) if compile_model else model
    opt_step = torch.compile(opt.step) if compile_opt else opt.step
    batches, info = iter(data), {}

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = spec.loss(forward, next(batches))
        loss.backward()
        if chain:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt_step()
        if chain:
            schedule.step()

    if compile_model:
        info.update(_compile_seconds(train_step, device))

    def run(n):
        stamps = []
        for _ in range(n):
            train_step()
            stamps.append(now())
        return stamps

    return common.Runner("", run, info=info)


def _functrain(
    spec, data, device, now, *, compiled: bool, use_fit: bool, pure=False, chain=False
) -> common.Runner:
    import functrain
    from functrain import optim, schedules

    model = spec.build().to(device)
    if chain:
        lr = LR * schedules.cosine_annealing_with_warmup(f"{WARMUP}ba", t_max=f"{HORIZON}ba")
        opt = optim.chain(
            optim.clip_by_global_norm(1.0),
            optim.adamw(lr, weight_decay=WEIGHT_DECAY, weight_decay_mask=optim.no_decay_mask),
        )
    else:
        opt = optim.adamw(lr=LR, weight_decay=WEIGHT_DECAY)
    step = functrain.make_step(model, spec.loss, opt, donate=not pure)
    if compiled:
        step = functrain.compile_step(step)
    holder = {"state": functrain.init(model, opt, seed=0)}
    batches, info = iter(data), {}

    if compiled:

        def warm():
            holder["state"], _ = step(holder["state"], next(batches))

        info.update(_compile_seconds(warm, device))

    if use_fit:
        from functrain import fit

        class Tick:
            def __init__(self):
                self.stamps = []

            def batch_end(self, ctx):
                self.stamps.append(now())

        def run(n):
            tick = Tick()
            state = holder["state"]
            holder["state"] = fit(  # one epoch of n batches: no mid-epoch resume between blocks
                step,
                state,
                data.take(n),
                duration=f"{state.step + n}ba",
                eval_interval=None,
                log_interval=None,
                callbacks=[tick],
                progress=False,  # the peers run with their progress bars off too
            )
            return tick.stamps

        return common.Runner("", run, info=info)

    def run(n):
        stamps, state = [], holder["state"]
        for _ in range(n):
            state, _ = step(state, next(batches))
            stamps.append(now())
        holder["state"] = state
        return stamps

    return common.Runner("", run, info=info)


def _compile_seconds(train_step: Callable[[], Any], device) -> dict:
    """The first two calls' wall seconds, and `compile_s`: their sum less two steady calls.

    Two calls, since a step that recompiles does so on its second call (a value guarded on
    changed); the steady calls' time is taken away so that only compiling counts.
    """
    first = _first_call_seconds(train_step, device)
    second = _first_call_seconds(train_step, device)
    steady = min(_first_call_seconds(train_step, device) for _ in range(2))
    return {
        "compile_s_first": first,
        "compile_s_second": second,
        "compile_s": max(0.0, first + second - 2 * steady),
    }


def _first_call_seconds(fn: Callable[[], Any], device) -> float:
    """Wall seconds of one call (compilers work in other processes: CPU time would miss them)."""
    now = common.clock("wall", device)
    start = now()
    fn()
    return now() - start


PEERS = ("composer", "composer_defaults", "lightning", "lightning_defaults")


def unavailable(name: str) -> str | None:
    """Why variant `name` cannot run here (a peer that is not installed), or None."""
    if name in PEERS:
        return peers.missing(name.partition("_")[0])
    return None


def build_variant(name: str, spec: ModelSpec, data: Batches, device: torch.device, now=None):
    """Prepare variant `name` on `spec` (check `unavailable(name)` first); returns a `Runner`.

    Args:
        name: a key of `VARIANTS`.
        spec: the model.
        data: its batches.
        device: where the model trains.
        now: the clock read after every step (default: `common.clock("wall", device)`).
    """
    now = now or common.clock("wall", device)
    if name in PEERS:
        trainer, _, defaults = name.partition("_")
        make = peers.composer_runner if trainer == "composer" else peers.lightning_runner
        runner = make(
            spec, data, device, now, defaults=bool(defaults), lr=LR, weight_decay=WEIGHT_DECAY
        )
    elif name.startswith("torch"):
        runner = _hand_written(
            spec,
            data,
            device,
            now,
            fused=name != "torch",
            compile_model=name in ("torch_compiled", "torch_compiled_opt"),
            chain=name == "torch_chain",
            compile_opt=name == "torch_compiled_opt",
        )
    elif name in VARIANTS and name.startswith("functrain"):
        runner = _functrain(
            spec,
            data,
            device,
            now,
            compiled=name == "functrain_compiled",
            use_fit=name == "functrain_fit",
            pure=name in ("functrain_pure", "functrain_chain"),
            chain=name in ("functrain_chain", "functrain_chain_donate"),
        )
    else:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    runner.name = name
    return runner


# ------------------------------------------------------------------------------------------------
# the suites


def parse_args(argv: Sequence[str] | None, suite: str) -> argparse.Namespace:
    """The options of `python -m bench overhead|memory` (see `--help`)."""
    specs = model_specs()
    parser = argparse.ArgumentParser(
        prog=f"python -m bench {suite}", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--models", default=",".join(specs), help="comma-separated, of: %(default)s"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of: %(default)s"
    )
    parser.add_argument("--reps", type=int, default=10, help="interleaved repetitions (overhead)")
    parser.add_argument(
        "--steps-scale", type=float, default=1.0, help="scales each model's steps per block"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="time by this process's CPU time (default: steady on a shared machine) or wall time",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: 1 with --clock cpu, else torch's)",
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda (overhead only, --clock wall)"
    )
    if suite == "overhead":
        parser.add_argument(
            "--only",
            choices=("import", "steps"),
            help="just the start-up row (import), or just the step timings (steps)",
        )
        parser.add_argument(
            "--import-reps",
            type=int,
            default=10,
            help="interleaved fresh-process imports of torch and functrain (start-up row)",
        )
    parser.add_argument("--out", help=f"the JSON file (default: bench/results/{suite}.json)")
    args = parser.parse_args(argv)
    args.models = _choose(parser, args.models, specs, "model")
    args.variants = _choose(parser, args.variants, VARIANTS, "variant")
    if args.reps < 1 or args.warmup < 1 or args.steps_scale <= 0:
        parser.error("--reps and --warmup must be >= 1, and --steps-scale > 0")
    if getattr(args, "import_reps", 1) < 1:
        parser.error("--import-reps must be >= 1")
    if args.threads is None:  # CPU time of several threads would count their spin-waiting too
        args.threads = 1 if args.clock == "cpu" else torch.get_num_threads()
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and args.clock != "wall":
        parser.error("on CUDA use --clock wall: device time is not this process's CPU time")
    if suite == "memory" and args.device.type != "cpu":
        parser.error("the memory suite measures torch's CPU allocations: use --device cpu")
    return args


def _choose(parser, text: str, known, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(
            f"unknown {what} {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}"
        )
    return names


def main(argv: Sequence[str] | None = None) -> dict:
    """`python -m bench overhead`: time every variant on every model; print tables, write JSON."""
    args = parse_args(argv, "overhead")
    with _threads(args.threads), common.fresh_compile_cache() as fresh:
        return _overhead(args, argv, fresh)


@contextlib.contextmanager
def _threads(count: int):
    """torch's intra-op thread count set for the suite, and restored after (`all` goes on)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _overhead(args: argparse.Namespace, argv, fresh_cache: bool) -> dict:
    started = time.perf_counter()
    report = common.new_report(
        "overhead",
        argv,
        config={
            "reps": args.reps,
            "warmup": args.warmup,
            "steps_scale": args.steps_scale,
            "device": str(args.device),
            "clock": args.clock,
            "threads": args.threads,
            "lr": LR,
            "weight_decay": WEIGHT_DECAY,
        },
        baseline="the faster (lower median) of: " + ", ".join(BASELINE),
        variants={v: VARIANTS[v] for v in args.variants},
        peers=peers.versions() if set(args.variants) & set(PEERS) else {},
        models={},
    )
    report["config"]["fresh_compile_cache"] = fresh_cache
    if args.only != "steps":
        report["import"] = import_time.measure(args.import_reps, args.clock)
    if args.only != "import":
        for model_name in args.models:
            spec = model_specs()[model_name]
            report["models"][model_name] = _time_model(spec, args, fresh_cache)
    report["goals"] = check_goals(report["models"])
    if "import" in report:
        report["goals"].insert(0, import_time.goal(report["import"]))
    report["total_s"] = time.perf_counter() - started
    path = common.write_json(args.out or f"{common.RESULTS_DIR}/overhead.json", report)
    if "import" in report:
        print(import_time.table(report["import"]))
        print()
    if report["models"]:
        print(common.variants_table(report, "median_ms", "ms"))
        print()
        print(compile_table(report))
        print()
    print(common.goals_table(report["goals"]))
    print(f"\n{report['total_s']:.0f} s in all; JSON written to {path}")
    return report


def measure_compile(model: str, variant: str, threads: int) -> dict:
    """Build `variant` on `model` here and return its compile facts (`compile_s`, ...)."""
    torch.set_num_threads(threads)
    spec = model_specs()[model]
    runner = build_variant(variant, spec, Batches(spec, torch.device("cpu")))
    runner.close()
    return {k: v for k, v in runner.info.items() if k.startswith("compile_s")}


def _compile_in_fresh_process(model: str, variant: str, threads: int) -> dict:
    """`measure_compile` in a new process with an empty inductor cache of its own."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import json, sys; from bench.overhead import measure_compile; "
        "print(json.dumps(measure_compile(sys.argv[1], sys.argv[2], int(sys.argv[3]))))"
    )
    with tempfile.TemporaryDirectory(prefix="bench-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [sys.executable, "-c", code, model, variant, str(threads)],
            cwd=root, env=env, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
    if proc.returncode != 0:
        return {"compile_error": proc.stderr[-400:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _time_model(spec: ModelSpec, args: argparse.Namespace, fresh_cache: bool = False) -> dict:
    """Build and warm up every variant on `spec`, then time them interleaved."""
    steps = max(2, round(spec.steps * args.steps_scale))
    data, now = Batches(spec, args.device), common.clock(args.clock, args.device)
    _reset_compiler()
    runners, results = {}, {}
    for name in args.variants:
        results[name] = {"status": "skipped", "reason": unavailable(name)}
        if results[name]["reason"]:
            common.log(f"[overhead] {spec.name}/{name}: skipped ({results[name]['reason']})")
            continue
        started = time.perf_counter()
        try:
            runner = build_variant(name, spec, data, args.device, now)
            runner.run(args.warmup)
        except Exception as error:  # report it beside the others' results; do not stop
            results[name] = {"status": "failed", "reason": common.describe_error(error)}
            common.log(f"[overhead] {spec.name}/{name}: FAILED ({results[name]['reason']})")
            continue
        runner.info["setup_s"] = time.perf_counter() - started
        common.log(f"[overhead] {spec.name}/{name}: ready in {runner.info['setup_s']:.1f} s")
        runners[name] = runner

    def progress(rep, name, seconds):
        common.log(
            f"[overhead] {spec.name} rep {rep + 1}/{args.reps} {name}: {1e3 * seconds:.3f} ms"
        )

    try:
        timed = common.interleave(
            runners, steps=steps, reps=args.reps, baseline=BASELINE, on_block=progress
        )
    finally:
        for runner in runners.values():
            runner.close()
    for name, runner in runners.items():
        results[name] = {"status": "ok", **timed["variants"][name], **runner.info}
        if name in COMPILED and fresh_cache:
            # In this process the variants share inductor's caches, so whichever compiles
            # second reuses the first's kernels: each is timed again in a process of its own.
            fresh = _compile_in_fresh_process(spec.name, name, args.threads)
            results[name]["compile_s_in_process"] = results[name].get("compile_s")
            results[name].update(fresh)
    return {
        "description": spec.description,
        "parameters": sum(p.numel() for p in spec.build().parameters()),
        "steps_per_block": steps,
        "baseline": timed["baseline"],
        "variants": results,
    }


def _reset_compiler() -> None:
    """Forget what torch.compile saw before, so every model compiles as in a fresh process.

    Dynamo keys its caches and its shape history by code object, and the benchmark models share
    code (both MLPs are a `Sequential`; every compiled step runs `CompiledStep._core`): without a
    reset, the second model would compile with dynamic shapes and later ones hit the recompile
    limit and silently run eagerly. Only called when no compiled variant of another model lives.
    """
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# goals and the compile table

TIME_GOALS = {  # variant -> (limit, {model: limit}) on its ratio to the faster hand-written loop
    "functrain_pure": (1.05, {"tiny_mlp": 1.15}),
    "functrain": (1.05, {"tiny_mlp": 1.15}),
    "functrain_fit": (1.05, {"tiny_mlp": 1.20}),
    "functrain_chain": (None, {"mlp": 1.05}),
    "functrain_chain_donate": (None, {"mlp": 1.05}),
    "functrain_compiled": (None, {"cnn": 0.80, "gpt": 0.92}),
}
COMPILE_TIME_GOAL = 1.2  # functrain_compiled's compile seconds over torch_compiled_opt's
MEMORY_GOAL = 1.10


def check_goals(models: dict, memory: bool = False) -> list[dict]:
    """The issue's goals met or missed, each with the measured ratio and its limit."""
    goals = []
    for model, entry in models.items():

        def ratio(name, variants=entry["variants"]):
            result = variants.get(name, {})
            return result.get("ratio") if result.get("status") == "ok" else None

        if memory:
            for name in ("functrain", "functrain_fit", "functrain_compiled"):
                if ratio(name) is not None:
                    goals.append(
                        common.goal(model, f"{name} peak memory", ratio(name), MEMORY_GOAL)
                    )
            continue
        for name, (default, per_model) in TIME_GOALS.items():
            limit = per_model.get(model, default)
            if limit is not None and ratio(name) is not None:
                goals.append(common.goal(model, f"{name} time", ratio(name), limit))
        if ratio("functrain_compiled") is not None and ratio("torch_compiled") is not None:
            what = "functrain_compiled faster than torch_compiled"
            goals.append(
                common.goal(model, what, ratio("functrain_compiled"), ratio("torch_compiled"))
            )
        ours, theirs = (
            entry["variants"].get(n, {}) for n in ("functrain_compiled", "torch_compiled_opt")
        )
        if ours.get("compile_s") is not None and theirs.get("compile_s"):
            goals.append(
                common.goal(
                    model,
                    "functrain_compiled compile time / torch_compiled_opt's",
                    ours["compile_s"] / theirs["compile_s"],
                    COMPILE_TIME_GOAL,
                )
            )
        # Like for like: functrain's loop (fit) against the peers' Trainer.fit.
        ours = "functrain_fit" if ratio("functrain_fit") is not None else "functrain"
        for peer in PEERS:
            if ratio(ours) is not None and ratio(peer) is not None:
                goals.append(
                    common.goal(model, f"{ours} faster than {peer}", ratio(ours), ratio(peer))
                )
    return goals


def compile_table(report: dict) -> str:
    """Wall seconds spent compiling (the first two calls less two steady ones), each variant in a
    process of its own with an empty compile cache."""
    models = list(report["models"])
    rows = []
    for variant in COMPILED:
        if variant in report["variants"]:
            cells = [report["models"][m]["variants"][variant] for m in models]
            rows.append([f"{variant} compile s", *(c.get("compile_s") for c in cells)])
    return common.markdown_table(["first calls", *models], rows)
