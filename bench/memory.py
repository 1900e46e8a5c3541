"""`python -m bench memory`: the peak bytes torch allocates per variant of `bench overhead`.

Each variant is built from scratch inside its own profiling window (see
`bench.common.peak_allocated_bytes`); the ratio is to the lower of the two hand-written loops.

Usage:
    python -m bench memory [--models ...] [--variants ...]
    python -m bench memory --activations [--layers 4 --length 256 ...]   (checkpointing rows)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from . import common
from .models import Batches, ModelSpec, model_specs
from .overhead import (
    BASELINE,
    VARIANTS,
    _reset_compiler,
    _threads,
    build_variant,
    check_goals,
    parse_args,
    unavailable,
)


def main(argv: Sequence[str] | None = None) -> dict:
    """`python -m bench memory`: the peak bytes torch allocates per variant; table and JSON.

    `python -m bench memory --activations [...]`: activation checkpointing's rows instead
    (bench/activation_memory.py; its options with `--activations --help`).
    """
    if argv is not None and "--activations" in argv:
        from . import activation_memory

        return activation_memory.main([a for a in argv if a != "--activations"])
    args = parse_args(argv, "memory")
    with _threads(args.threads), common.fresh_compile_cache():
        return _memory(args, argv)


def _memory(args: argparse.Namespace, argv) -> dict:
    started = time.perf_counter()
    report = common.new_report(
        "memory",
        argv,
        method=(
            "torch.profiler allocation events (profile_memory=True): the most bytes allocated "
            "at once during the measured steps, counted from before the variant was built"
        ),
        config={
            "warmup": args.warmup,
            "measured_steps": MEMORY_STEPS,
            "device": str(args.device),
            "threads": args.threads,
        },
        variants={v: VARIANTS[v] for v in args.variants},
        models={},
    )
    for model_name in args.models:
        report["models"][model_name] = _measure_memory(model_specs()[model_name], args)
    report["goals"] = check_goals(report["models"], memory=True)
    report["total_s"] = time.perf_counter() - started
    path = common.write_json(args.out or f"{common.RESULTS_DIR}/memory.json", report)
    print(common.variants_table(report, "peak_mib", "MiB"))
    print()
    print(common.goals_table(report["goals"]))
    print(f"\n{report['total_s']:.0f} s in all; JSON written to {path}")
    return report


MEMORY_STEPS = 2


def _measure_memory(spec: ModelSpec, args: argparse.Namespace) -> dict:
    """Each variant's peak, built from scratch inside its own profiling window."""
    data = Batches(spec, args.device)  # outside the windows: the same for every variant
    results = {}
    for name in args.variants:
        results[name] = {"status": "skipped", "reason": unavailable(name)}
        if results[name]["reason"]:
            common.log(f"[memory] {spec.name}/{name}: skipped ({results[name]['reason']})")
            continue
        common.log(f"[memory] {spec.name}/{name}")
        _reset_compiler()
        try:
            measured = common.peak_allocated_bytes(
                lambda name=name: build_variant(name, spec, data, args.device),
                warmup=args.warmup,
                steps=MEMORY_STEPS,
            )
        except Exception as error:  # report it beside the others' results; do not stop
            results[name] = {"status": "failed", "reason": common.describe_error(error)}
            common.log(f"[memory] {spec.name}/{name}: FAILED ({results[name]['reason']})")
            continue
        results[name] = {"status": "ok", **measured, "peak_mib": measured["peak_bytes"] / 2**20}
    floors = [
        results[b]["peak_bytes"] for b in BASELINE if results.get(b, {}).get("status") == "ok"
    ]
    for entry in results.values():
        if entry["status"] == "ok":
            entry["ratio"] = entry["peak_bytes"] / min(floors) if floors else None
    return {"description": spec.description, "variants": results}
