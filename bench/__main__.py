"""The single entry point: `python -m bench <suite> [options]`.

Suites:
    overhead          step time of functrain, hand-written PyTorch and peer trainers (bench/overhead.py)
    memory            peak memory of the same variants (bench/memory.py)
    checkpoint        checkpoint save/load throughput (bench/checkpoint.py)
    distributed       data- and model-parallel scaling (bench/distributed.py)
    time_to_accuracy  speedup algorithms, time to a target accuracy (bench/time_to_accuracy.py)
    update            the ways to run a pure AdamW update, side by side (bench/update_paths.py)
    ensemble          an 8-member ensemble step, vmapped vs sequential (bench/ensemble.py)
    gpu_check         what only a CUDA GPU shows, one table (bench/gpu_check.py; skips on CPU)
    exits             many short multi-rank runs: aborts and hangs at exit (bench/exits.py)
    scenarios         issue 11's scenario matrix, strength 3 or the full product (bench/scenarios.py)
    mutants           mutation testing of core modules with cosmic-ray (bench/mutants.py; not in `all`)
    torch_versions    the core tests in one venv per torch version (bench/torch_versions.py; not in `all`)
    all               every suite above with its defaults, one after the other

Each suite prints a table and writes JSON under bench/results/. Suites are imported only when run,
so one that is missing or broken is reported and the others still run.

Example:
    python -m bench overhead --models tiny_mlp --reps 3
    python -m bench all
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from collections.abc import Sequence

# suite -> (module, function): every function takes argv (the options after the suite's name).
SUITES = {
    "overhead": ("bench.overhead", "main"),
    "memory": ("bench.memory", "main"),
    "checkpoint": ("bench.checkpoint", "main"),
    "distributed": ("bench.distributed", "main"),
    "time_to_accuracy": ("bench.time_to_accuracy", "main"),
    "gpu_check": ("bench.gpu_check", "main"),
    "update": ("bench.update_paths", "main"),
    "ensemble": ("bench.ensemble", "main"),
    "exits": ("bench.exits", "main"),
    "scenarios": ("bench.scenarios", "main"),
    "mutants": ("bench.mutants", "main"),
    "torch_versions": ("bench.torch_versions", "main"),
}
# minutes per module, or gigabytes of installs per torch version: run them on their own
NOT_IN_ALL = {"mutants", "torch_versions"}


class SuiteMissing(RuntimeError):
    """A suite's module is not in this checkout."""


def load_suite(name: str):
    """The `main(argv)` of suite `name`, imported now.

    Raises:
        SuiteMissing: its module does not exist (it names the file).
        KeyError: `name` is not a suite.
    """
    module_name, function = SUITES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise  # the suite exists but one of its own imports is missing: show the real error
        path = module_name.replace(".", "/") + ".py"
        raise SuiteMissing(f"suite {name!r} is not available: {path} does not exist") from None
    return getattr(module, function)


def run_suite(name: str, argv: Sequence[str]) -> int:
    """Run one suite; returns a process exit code (0 on success)."""
    try:
        main = load_suite(name)
    except SuiteMissing as error:
        print(error, file=sys.stderr)
        return 3
    result = main(list(argv))
    return result if isinstance(result, int) else 0


def run_all(argv: Sequence[str]) -> int:
    """Every suite in turn; a missing or failing one is reported and the rest still run."""
    if argv:
        print("`all` takes no options (run the suites one by one to pass options)", file=sys.stderr)
        return 2
    outcome = {}
    for name in SUITES:
        if name in NOT_IN_ALL:
            continue
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        try:
            code = run_suite(name, [])
        except SystemExit as error:  # a suite's argparse or sys.exit: keep going
            code = 0 if error.code is None else error.code if isinstance(error.code, int) else 1
        except Exception:  # one broken suite must not hide the others' results
            traceback.print_exc()
            code = None
        outcome[name] = {None: "failed", 0: "ok", 3: "missing"}.get(code, f"exit {code}")
        outcome[name] += f" ({time.perf_counter() - started:.0f} s)"
    print("\n=== summary ===")
    for name, what in outcome.items():
        print(f"{name:>17}: {what}")
    return 0 if all(v.startswith(("ok", "missing")) for v in outcome.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    suite, rest = argv[0], argv[1:]
    if suite == "all":
        return run_all(rest)
    if suite not in SUITES:
        print(
            f"unknown suite {suite!r}; choose from {', '.join([*SUITES, 'all'])} "
            "(python -m bench --help)",
            file=sys.stderr,
        )
        return 2
    return run_suite(suite, rest)


if __name__ == "__main__":
    sys.exit(main())
