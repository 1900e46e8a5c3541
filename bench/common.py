"""Timing and reporting helpers shared by the benchmark suites.

A benchmark compares *variants* (ways of training the same model on the same batches). Each
variant is prepared once as a `Runner` whose `run(n)` trains `n` more steps and returns the clock
reading after each one. `interleave` then runs the variants in turn, a block of steps each, for
several repetitions, rotating the order every repetition, so slow drifts of a shared machine hit
every variant alike. Results are medians over repetitions, and ratios are taken per repetition
against the baseline measured in the same repetition, then their median is reported.

Peak memory on CPU: torch's CPU allocator keeps no statistics, and RSS or `tracemalloc` either
include the interpreter and libraries or miss torch's allocations. `peak_allocated_bytes` reads
the allocation events of `torch.profiler` (`profile_memory=True`), each of which carries the bytes
allocated since profiling began, so a variant built inside the profiled window is measured from
zero: its model, optimizer state, gradients and activations, and nothing else.

Example:
    >>> runners = {"a": Runner("a", run_a), "b": Runner("b", run_b)}
    >>> result = interleave(runners, steps=20, reps=5, baseline=["a"])
    >>> result["variants"]["b"]["median_ms"], result["variants"]["b"]["ratio"]
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclass
class Runner:
    """A prepared variant.

    Attributes:
        name: the variant's name in tables and JSON.
        run: `run(n) -> [n clock readings]`, one after each of `n` training steps.
        close: releases what the variant holds (threads, files); called once at the end.
        info: facts to report with the timings (e.g. `compile_s`, the first call's seconds).
    """

    name: str
    run: Callable[[int], list[float]]
    close: Callable[[], None] = lambda: None
    info: dict[str, Any] = field(default_factory=dict)


def clock(kind: str = "cpu", device: torch.device | str = "cpu") -> Callable[[], float]:
    """A clock for timing steps.

    Args:
        kind: "cpu" reads this process's CPU time (user + system, all threads): on a shared
            machine it leaves out the time other processes hold the cores, so it is far steadier
            than wall time; it equals wall time for a single-threaded run on an idle machine. Use
            it with one intra-op thread (other threads' spinning would count). "wall" reads
            `time.perf_counter`.
        device: on CUDA the clock first waits for queued work (and must be "wall": device time
            is not CPU time).
    """
    if kind not in ("cpu", "wall"):
        raise ValueError(f"clock kind must be 'cpu' or 'wall', got {kind!r}")
    if torch.device(device).type == "cuda":
        if kind != "wall":
            raise ValueError("on CUDA time steps with the wall clock (--clock wall)")

        def read() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return read
    return time.process_time if kind == "cpu" else time.perf_counter


def seconds_per_step(stamps: Sequence[float]) -> float:
    """Mean seconds between consecutive clock readings (needs at least two).

    Taking the first reading *after* a step keeps the variant's per-call setup (Trainer.fit,
    DataLoader iterator creation) out of the measurement: only whole loop iterations count.
    """
    if len(stamps) < 2:
        raise ValueError(f"need at least two clock readings to time a step, got {len(stamps)}")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def interleave(
    runners: dict[str, Runner],
    *,
    steps: int,
    reps: int,
    baseline: Iterable[str] = (),
    on_block: Callable[[int, str, float], None] | None = None,
) -> dict[str, Any]:
    """Time every runner `reps` times, `steps` steps per block, interleaved in one process.

    Args:
        runners: the prepared variants, by name.
        steps: steps timed per block (each block runs `steps + 1`: the first reading opens it).
        reps: repetitions; the order of the variants rotates by one every repetition.
        baseline: candidate references of the ratios; the one with the lowest median is used
            (e.g. the default and the fused hand-written loop: the floor is the faster of the
            two). Choosing by median, not per repetition, keeps the noise of two near-equal
            candidates from biasing the floor low.
        on_block: called as `on_block(rep, name, seconds_per_step)` after each block (progress).
    Returns:
        `{"baseline": name | None, "variants": {name: {"median_ms", "min_ms", "times_ms",
        "ratio", "ratio_quartiles", "ratios"}}}`; `ratios` holds each repetition's time over the
        baseline's in that same repetition, `ratio` is their median and `ratio_quartiles` their
        first and third quartiles (None without a baseline).
    """
    if steps < 1 or reps < 1:
        raise ValueError(f"steps and reps must be >= 1, got steps={steps}, reps={reps}")
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = seconds_per_step(runners[name].run(steps + 1))
            times[name].append(seconds)
            if on_block is not None:
                on_block(rep, name, seconds)
    candidates = [b for b in baseline if b in runners]
    floor = min(candidates, key=lambda b: statistics.median(times[b])) if candidates else None
    variants = {}
    for name in names:
        ratios = [t / f for t, f in zip(times[name], times[floor])] if floor else None
        variants[name] = {
            "median_ms": 1e3 * statistics.median(times[name]),
            "min_ms": 1e3 * min(times[name]),
            "times_ms": [1e3 * t for t in times[name]],
            "ratio": statistics.median(ratios) if ratios else None,
            "ratio_quartiles": _quartiles(ratios) if ratios else None,
            "ratios": ratios,
        }
    return {"baseline": floor, "variants": variants}


def peak_allocated_bytes(build: Callable[[], Runner], *, warmup: int, steps: int) -> dict:
    """Peak bytes torch holds on the CPU while a variant trains, measured from before it exists.

    Builds the variant under `torch.profiler` with memory profiling, trains `warmup` steps (the
    optimizer creates its state, a compiled step compiles), then `steps` more inside a marked
    window. Every allocation event reports the total allocated since profiling began, so the
    window's maximum is the variant's peak: parameters, optimizer state, gradients and
    activations (including anything that outlives a step, such as a second copy of the state).

    Args:
        build: makes the `Runner` (its model and optimizer must be created inside this call).
        warmup: steps before the window.
        steps: steps inside the window (>= 1).
    Returns:
        `{"peak_bytes", "steady_bytes"}`: the window's maximum, and what was held when it opened.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    marker = "bench.measured_steps"
    gc.collect()  # free earlier variants (closures make cycles) before the counter starts
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner = build()
        try:
            if warmup:
                runner.run(warmup)
            with record_function(marker):
                runner.run(steps)
        finally:
            runner.close()
    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    window = [e for e in events if e.name == marker]
    if not window:
        raise RuntimeError("the profiler recorded no measurement window; is profiling disabled?")
    start, end = window[0].start_time_ns, window[0].end_time_ns
    allocations = sorted(
        (e for e in events if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns
    )
    if not allocations:
        raise RuntimeError("the profiler recorded no allocation; is profile_memory working?")
    # The allocator's running total is process-wide: anything still alive from an earlier
    # profiling session is in it, so count from its value when this session began.
    first = allocations[0].extra_fields
    origin = first.total_allocated - first.alloc_size
    before = [e.extra_fields.total_allocated for e in allocations if e.start_time_ns < start]
    inside = [
        e.extra_fields.total_allocated for e in allocations if start <= e.start_time_ns <= end
    ]
    steady = before[-1] if before else origin
    return {
        "peak_bytes": int(max([steady, *inside]) - origin),
        "steady_bytes": int(steady - origin),
    }


def _quartiles(values: Sequence[float]) -> list[float]:
    """The first and third quartiles (the spread of a ratio across repetitions)."""
    if len(values) < 2:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


@contextlib.contextmanager
def fresh_compile_cache():
    """Run with an empty, temporary TorchInductor cache, so compile times are a fresh machine's.

    A cache left by an earlier run would make `torch.compile` look many times faster than a
    first run is. Respects a `TORCHINDUCTOR_CACHE_DIR` the user set before starting the bench
    (the reported compile times are then for that cache). Yields whether the cache is fresh.
    """
    from . import USER_INDUCTOR_CACHE_DIR

    if USER_INDUCTOR_CACHE_DIR:
        yield False
        return
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # torch may have filled in its default
    path = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    try:
        yield True
    finally:
        if saved is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
        shutil.rmtree(path, ignore_errors=True)


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def environment() -> dict[str, Any]:
    """Facts that explain a result: versions, CPU, threads, load, the commit."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=os.path.dirname(RESULTS_DIR),
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "git_commit": commit or None,
    }


def timestamp() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def new_report(suite: str, argv: Sequence[str] | None, **fields: Any) -> dict[str, Any]:
    """The common head of a suite's JSON: suite, time, the command, the environment, `fields`."""
    return {
        "suite": suite,
        "created": timestamp(),
        "command": " ".join(["python -m bench", suite, *(argv or [])]),
        "environment": environment(),
        **fields,
    }


def write_json(path: str | os.PathLike, payload: dict) -> str:
    """Write `payload` as indented JSON atomically (a `.tmp` file renamed); returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def log(message: str) -> None:
    """Progress to stderr (stdout carries only the tables)."""
    print(message, file=sys.stderr, flush=True)


def describe_error(error: BaseException) -> str:
    """An error's type and first line (plus torch.compile's "Explanation:" line), for reports."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = " ".join(lines[:1] + [line for line in lines[1:] if line.startswith("Explanation:")])
    return f"{type(error).__name__}: {text}"[:400]


# ------------------------------------------------------------------------------------------------
# tables


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; columns whose cells start with a digit are right-aligned.

    Floats print with 3 significant digits, None as an en dash.
    """
    rows = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    right = [
        i > 0 and all(r[i][:1].isdigit() or r[i] == "–" for r in rows) for i in range(len(header))
    ]

    def line(cells):
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        "-" * (w + 1) + ":" if r else "-" * (w + 2) for w, r in zip(widths, right)
    )
    return "\n".join([line(header), rule + "|", *(line(r) for r in rows)])


def variants_table(report: dict, value_key: str, unit: str) -> str:
    """One row per variant, one column per model: `value unit (ratio×)`, plus notes on the
    variants that were skipped (not installed) or failed (with the error)."""
    models = list(report["models"])
    rows = []
    for variant in report["variants"]:
        row = [variant]
        for model in models:
            entry = report["models"][model]["variants"].get(variant, {})
            if entry.get("status") != "ok":
                row.append(entry.get("status"))
                continue
            ratio = entry.get("ratio")
            text = f"{_cell(entry[value_key])} {unit}"
            row.append(text if ratio is None else f"{text} ({ratio:.2f}×)")
        rows.append(row)
    return markdown_table(["variant", *models], rows) + _notes(report)


def _notes(report: dict) -> str:
    notes = {}
    for model, entry in report["models"].items():
        for variant, result in entry["variants"].items():
            if result.get("status") == "skipped":
                notes[variant] = f"{variant}: skipped ({result['reason']})"
            elif result.get("status") == "failed":
                notes[f"{variant}/{model}"] = f"{variant} on {model}: failed ({result['reason']})"
    return "".join("\n\n" + line for line in notes.values())


def goal(model: str, what: str, value: float, limit: float) -> dict[str, Any]:
    """A goal's record: met when `value <= limit`; `by` is `value / limit`."""
    return {
        "model": model,
        "goal": what,
        "value": value,
        "limit": limit,
        "met": value <= limit,
        "by": value / limit,
    }


def goals_table(goals: Sequence[dict]) -> str:
    """The goals as a table: measured value, limit, met or not."""
    rows = [
        [
            g["model"],
            g["goal"],
            f"{g['value']:.3f}",
            f"{g['limit']:.3f}",
            "yes" if g["met"] else "**no**",
        ]
        for g in goals
    ]
    return markdown_table(["model", "goal", "measured", "limit", "met"], rows)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
