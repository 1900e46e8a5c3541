"""Mutation testing: how many small deliberate bugs in a core module its tests catch.

`python -m bench mutants` runs cosmic-ray (the `mutation` extra: `pip install -e ".[mutation]"`)
on a copy of this checkout, never on the working tree: for each mutant (an operator swapped, a
comparison flipped, a number changed, a `not` added, ...) it runs the tests that cover the module
and records whether they failed (killed) or passed (survived). It prints the kill rate per module
and every surviving mutant as a diff, and writes the whole as JSON under bench/results/.

A module has hundreds of mutants and each costs one pytest run (seconds: torch's import), so by
default one mutant is kept per source position and operator family (e.g. of the eleven ways to
replace a `+`, one, chosen by the seed), and at most `--max` of those, sampled with the seed.
`--max 0` keeps them all. Not part of `.ci/run` (minutes per module on 2 cores).

Example:
    python -m bench mutants --module functrain/time.py --max 40
    python -m bench mutants --module functrain/schedules/base.py --tests tests/schedules
    python -m bench mutants --catalogue        # every core module below (long)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS_DIR, write_json

ROOT = Path(__file__).resolve().parent.parent

# core module -> the tests that cover it (what `--catalogue` runs; issue 17's list)
CATALOGUE = {
    "functrain/time.py": ["tests/test_time.py"],
    "functrain/schedules/base.py": ["tests/schedules"],
    "functrain/schedules/decay.py": ["tests/schedules"],
    "functrain/schedules/warmup.py": ["tests/schedules"],
    "functrain/optim/base.py": ["tests/optim"],
    "functrain/optim/adam.py": ["tests/optim"],
    "functrain/optim/clipping.py": ["tests/optim"],
    "functrain/data.py": ["tests/test_data.py"],
    "functrain/pieces.py": ["tests/test_step.py", "tests/test_step_protocol.py"],
    "functrain/step.py": ["tests/test_step.py", "tests/test_step_checks.py"],
    "functrain/checkpoint/writer.py": ["tests/checkpoint/test_checkpoint_writer.py",
                                       "tests/checkpoint/test_checkpoint_commit_phases.py"],
    "functrain/checkpoint/reader.py": ["tests/checkpoint/test_checkpoint_reader.py"],
    "functrain/parallel/compute.py": ["tests/parallel/test_parallel_compute.py"],
    "functrain/parallel/plans.py": ["tests/parallel/test_parallel_plans.py"],
    "functrain/functional/mixup.py": ["tests/functional/test_fn_mixup.py",
                                      "tests/algorithms/test_algo_mixup.py"],
}  # fmt: skip


def _copy_checkout(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of this checkout, copied to `dest`."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _config(module: str, tests: list[str], timeout: float) -> str:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {float(timeout)}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(' '.join(command))}\n\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def _family(operator: str) -> str:
    """`core/ReplaceBinaryOperator_Add_Sub` -> `core/ReplaceBinaryOperator_Add` (the site's op)."""
    parts = operator.split("_")
    return "_".join(parts[:2]) if len(parts) > 2 else operator


def _thin(db: Path, max_mutants: int, seed: int) -> int:
    """Keep one mutant per (position, operator family), then at most `max_mutants`; the count."""
    rng = random.Random(seed)
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT job_id, operator_name, start_pos_row, start_pos_col FROM mutation_specs"
        ).fetchall()
        groups: dict[tuple, list[str]] = {}
        for job, operator, row, col in sorted(rows):
            groups.setdefault((_family(operator), row, col), []).append(job)
        keep = [rng.choice(jobs) for _, jobs in sorted(groups.items())]
        if max_mutants and len(keep) > max_mutants:
            keep = rng.sample(keep, max_mutants)
        drop = {job for job, *_ in rows} - set(keep)
        for table in ("mutation_specs", "work_items"):
            conn.executemany(f"DELETE FROM {table} WHERE job_id = ?", [(j,) for j in drop])
    return len(keep)


def _results(db: Path) -> list[dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.operator_name, s.start_pos_row, s.definition_name, r.worker_outcome, "
            "r.test_outcome, r.diff FROM mutation_specs s JOIN work_results r USING (job_id) "
            "ORDER BY s.start_pos_row, s.operator_name"
        ).fetchall()
    keys = ("operator", "line", "function", "worker_outcome", "test_outcome", "diff")
    out = [dict(zip(keys, row)) for row in rows]
    for r in out:  # cosmic-ray stores the enums' names ("KILLED", "NORMAL")
        r["test_outcome"] = (r["test_outcome"] or "").lower()
        r["worker_outcome"] = (r["worker_outcome"] or "").lower()
    return out


def mutate(module: str, tests: list[str], *, max_mutants: int, seed: int, timeout: float) -> dict:
    """Run the mutants of `module` against `tests` in a scratch copy; the summary."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="functrain-mutants-") as scratch:
        tree = Path(scratch) / "tree"
        _copy_checkout(tree)
        config, db = Path(scratch) / "cosmic-ray.toml", Path(scratch) / "session.sqlite"
        config.write_text(_config(module, tests, timeout))
        # the scratch copy first, so the mutated module is the one imported
        paths = [str(tree), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        cli = [sys.executable, "-m", "cosmic_ray.cli"]

        def run(*args):
            subprocess.run([*cli, *args, str(config), str(db)], cwd=tree, env=env, check=True,
                           capture_output=True)  # fmt: skip

        # the unmutated tests must pass, or every mutant would look killed
        baseline = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=tree, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if baseline.returncode != 0:
            raise RuntimeError(f"{tests} fail before any mutation:\n{baseline.stdout[-3000:]}")
        run("init")
        total = _thin(db, max_mutants, seed)
        run("exec")
        results = _results(db)
    killed = sum(r["test_outcome"] == "killed" for r in results)
    survived = [r for r in results if r["test_outcome"] == "survived"]
    incompetent = sum(r["test_outcome"] == "incompetent" for r in results)
    ran = killed + len(survived)
    return {
        "module": module,
        "tests": tests,
        "mutants": total,
        "killed": killed,
        "survived": len(survived),
        "incompetent": incompetent,  # the mutant could not even run (e.g. a timeout)
        "kill_rate": killed / ran if ran else None,
        "seconds": round(time.perf_counter() - start, 1),
        "survivors": survived,
        "results": results,
    }


def _print(summaries: list[dict]) -> None:
    print(f"{'module':40s} {'mutants':>8s} {'killed':>7s} {'survived':>9s} {'kill rate':>10s}")
    for s in summaries:
        rate = "-" if s["kill_rate"] is None else f"{100 * s['kill_rate']:.1f}%"
        print(
            f"{s['module']:40s} {s['mutants']:8d} {s['killed']:7d} {s['survived']:9d} {rate:>10s}"
        )
    for s in summaries:
        for r in s["survivors"]:
            print(f"\n--- survived: {s['module']}:{r['line']} in {r['function']} ({r['operator']})")
            print("\n".join(line for line in (r["diff"] or "").splitlines() if line[:1] in "+-"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mutants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--module", action="append", help="a module path (repeatable)")
    parser.add_argument("--tests", nargs="+", help="the tests to run (default: the catalogue's)")
    parser.add_argument("--catalogue", action="store_true", help="every module of the catalogue")
    parser.add_argument("--max", type=int, default=40, help="mutants per module (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    args = parser.parse_args(argv)
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        print('bench mutants needs cosmic-ray: pip install -e ".[mutation]"', file=sys.stderr)
        return 2
    modules = list(CATALOGUE) if args.catalogue else (args.module or ["functrain/time.py"])
    summaries = []
    for module in modules:
        tests = args.tests or CATALOGUE.get(module)
        if not tests:
            parser.error(f"no tests known for {module}: pass --tests")
        summaries.append(
            mutate(module, tests, max_mutants=args.max, seed=args.seed, timeout=args.timeout)
        )
    _print(summaries)
    payload = {"max": args.max, "seed": args.seed, "modules": summaries}
    path = write_json(os.path.join(RESULTS_DIR, "mutants.json"), payload)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
