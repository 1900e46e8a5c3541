"""Start-up: `import functrain` against `import torch`, each in fresh processes, interleaved.

Each repetition starts two new interpreters, one importing `torch` and one importing
`functrain` (which imports torch), in alternating order, and each reports the wall and CPU
seconds of its import alone (interpreter start-up excluded) and which heavy, imported-on-use
modules the import pulled in. The row is the median of the paired differences (functrain's
import less torch's in the same repetition), so the load of a shared machine cancels out as far
as it can; the goal (issue 15.5) is at most 0.3 s over `import torch`.

`import torch` ends with a full garbage collection pending (its import promotes enough objects
that the next young-generation collection runs a full one, 0.05-0.3 s over torch's heap): any
code after it pays that once, and `import functrain` is that code. So the torch child then
collects (`gc.collect()`) and imports functrain too, timed apart: the `after torch` column,
functrain's own import cost without that collection.

The children may write bytecode (PYTHONDONTWRITEBYTECODE is dropped from their environment) and
one untimed import of each comes first, so the numbers are those of an installed package, not of
compiling functrain's sources on every start.

Example:
    python -m bench overhead --only import --import-reps 15
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from . import common

GOAL_S = 0.3  # seconds over `import torch` (issue 15 point 5)
MODULES = ("torch", "functrain")
# Imported only when a feature needs them (functrain._lazy): their presence after a bare
# `import functrain` is a regression, reported beside the times.
HEAVY = (
    "torch.distributed.tensor",
    "torch._dynamo",
    "torch._inductor",
    "sympy",
    "tensorstore",
    "ml_dtypes",
    "safetensors",
    "orbax",
)

_CHILD = (
    "import gc, json, sys, time\n"
    "wall, cpu = time.perf_counter(), time.process_time()\n"
    "__import__(sys.argv[1])\n"
    "wall, cpu = time.perf_counter() - wall, time.process_time() - cpu\n"
    "heavy = [m for m in sys.argv[2].split(',') if m in sys.modules]\n"
    "out = {'wall_s': wall, 'cpu_s': cpu, 'heavy': heavy, 'modules': len(sys.modules)}\n"
    "if sys.argv[1] == 'torch':\n"
    "    gc.collect()\n"
    "    then = time.process_time()\n"
    "    import functrain\n"
    "    out['then_functrain_cpu_s'] = time.process_time() - then\n"
    "print(json.dumps(out))\n"
)


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_once(module: str) -> dict[str, Any]:
    """Import `module` in a new interpreter (this checkout first on the path); its timings.

    Returns:
        `{"wall_s", "cpu_s", "heavy": [heavy modules loaded], "modules": len(sys.modules)}`;
        for torch also `"then_functrain_cpu_s"`: importing functrain after torch and a full
        collection.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [_root(), env.get("PYTHONPATH")] if p)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, module, ",".join(HEAVY)],
        cwd=_root(), env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"import {module} failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


def measure(reps: int, clock: str = "cpu") -> dict[str, Any]:
    """Interleaved fresh-process imports of torch and functrain, `reps` pairs.

    Args:
        reps: repetitions (pairs of imports; the order alternates).
        clock: "cpu" (the child's CPU seconds: steadier on a shared machine) or "wall"; the
            other is reported too.
    Returns:
        `{"clock", "reps", "torch_s", "functrain_s", "over_torch_s", "over_torch_quartiles",
        "over_torch_<other clock>_s", "after_torch_cpu_s", "goal_s", "heavy", "modules",
        "samples"}`: medians in the chosen clock; `over_torch_s`
        is the median over repetitions of functrain's time less torch's; `heavy` the heavy
        modules a bare `import functrain` loaded (should be empty).
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    key = {"cpu": "cpu_s", "wall": "wall_s"}[clock]
    for module in MODULES:  # untimed: writes bytecode, warms the file cache
        import_once(module)
    samples: dict[str, list[dict]] = {m: [] for m in MODULES}
    for rep in range(reps):
        for module in MODULES if rep % 2 == 0 else MODULES[::-1]:
            samples[module].append(import_once(module))
        pair = {m: samples[m][-1][key] for m in MODULES}
        common.log(
            f"[overhead] import rep {rep + 1}/{reps}: torch {pair['torch']:.3f} s, "
            f"functrain {pair['functrain']:.3f} s ({clock})"
        )
    over = [f[key] - t[key] for f, t in zip(samples["functrain"], samples["torch"])]
    other = "wall_s" if key == "cpu_s" else "cpu_s"
    return {
        "clock": clock,
        "reps": reps,
        "torch_s": statistics.median(s[key] for s in samples["torch"]),
        "functrain_s": statistics.median(s[key] for s in samples["functrain"]),
        "over_torch_s": statistics.median(over),
        "over_torch_quartiles": _quartiles(over),
        f"over_torch_{other}": statistics.median(
            f[other] - t[other] for f, t in zip(samples["functrain"], samples["torch"])
        ),
        "after_torch_cpu_s": statistics.median(t["then_functrain_cpu_s"] for t in samples["torch"]),
        "goal_s": GOAL_S,
        "heavy": sorted({m for s in samples["functrain"] for m in s["heavy"]}),
        "modules": {m: samples[m][-1]["modules"] for m in MODULES},
        "samples": samples,
    }


def table(result: dict[str, Any]) -> str:
    """The start-up row: medians of torch, functrain, their paired difference, the goal."""
    other = "wall_s" if result["clock"] == "cpu" else "cpu_s"
    q1, q3 = result["over_torch_quartiles"]
    rows = [
        [
            f"import ({result['clock']} s, {result['reps']} reps)",
            result["torch_s"],
            result["functrain_s"],
            f"{result['over_torch_s']:.3f} [{q1:.3f}, {q3:.3f}]",
            f"{result[f'over_torch_{other}']:.3f}",
            f"{result['after_torch_cpu_s']:.3f}",
            result["goal_s"],
            ", ".join(result["heavy"]) or "none",
        ]
    ]
    header = [
        "start-up",
        "import torch",
        "import functrain",
        "functrain − torch [quartiles]",
        f"difference ({other[:-2]} s)",
        "after torch, collected (cpu s)",
        "goal",
        "heavy modules loaded",
    ]
    return common.markdown_table(header, rows)


def goal(result: dict[str, Any]) -> dict[str, Any]:
    """The goal's record for the goals table."""
    return common.goal(
        "import", "import functrain − import torch (s)", result["over_torch_s"], GOAL_S
    )
