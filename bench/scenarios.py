"""`python -m bench scenarios`: the scenario matrix of issue 11, bigger than CI runs it.

CI (`python -m pytest tests/scenarios`) runs a pairwise design: every two axis values meet in some
scenario. This command runs a strength-3 covering design by default (every three values meet,
206 scenarios), or the whole cross product (`--design full`, 7,056 interrupted scenarios: about
11 hours on the 2-core machine at the measured ~5 s a scenario), with the same harness and
checks (tests/scenarios/scenario_harness.py), and prints one row per scenario: result, time, the
known bugs that apply, and the first problem found.

Results: `pass`; `xfail` (failed, and every problem is explained by the known bugs listed, see
tests/scenarios/scenario_known.py); `XPASS` (a known bug applies but the scenario passed: its fix
landed, update the table); `FAIL` (a problem no known bug explains).

Example:
    python -m bench scenarios                         # strength 3
    python -m bench scenarios --design ci             # what CI runs
    python -m bench scenarios --only sigterm,ddp      # ids containing every given part
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time

from bench.common import RESULTS_DIR, log, markdown_table, new_report, write_json

SCENARIO_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "scenarios"
)


def _import_harness():
    if SCENARIO_DIR not in sys.path:
        sys.path.insert(0, SCENARIO_DIR)
    import scenario_designs
    import scenario_harness
    import scenario_known

    return scenario_designs, scenario_harness, scenario_known


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m bench scenarios", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--design", default="3", choices=("ci", "2", "3", "full"),
                        help="ci/2: pairwise; 3: every triple of axis values; full: the cross product")  # fmt: skip
    parser.add_argument("--only", default="", help="comma-separated parts every chosen id contains")
    parser.add_argument("--limit", type=int, default=0, help="run at most this many scenarios")
    parser.add_argument("--root", default=None, help="where the runs go (default: a scratch dir)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' files")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "scenarios.json"))
    return parser.parse_args(argv)


def classify(known, scenario, problems) -> str:
    bugs = known.applicable(scenario)
    if not problems:
        return "XPASS" if bugs else "pass"
    if bugs and not known.unexplained(scenario, problems):
        return "xfail"
    return "FAIL"


def main(argv=None) -> int:
    args = parse_args(argv or [])
    designs, harness, known = _import_harness()
    if args.design in ("ci", "2"):
        scenarios = designs.ci_scenarios()
    elif args.design == "3":
        scenarios = designs.scenarios_of_strength(3)
    else:
        scenarios = designs.all_scenarios()
    parts = [p for p in args.only.split(",") if p]
    scenarios = [s for s in scenarios if all(p in s.id for p in parts)]
    if args.limit:
        scenarios = scenarios[: args.limit]
    if not scenarios:
        print("no scenario matches", file=sys.stderr)
        return 2
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = args.root or tempfile.mkdtemp(prefix="functrain-scenarios-", dir=base)
    log(f"{len(scenarios)} scenarios (design {args.design}) under {root}")
    started = time.monotonic()
    try:
        matrix = harness.run_matrix(scenarios, root, log=log)
    finally:
        if not args.keep and not args.root:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - started
    rows, entries = [], []
    for o in matrix.outcomes:
        result = classify(known, o.scenario, o.problems)
        points = ", ".join(b.point for b in known.applicable(o.scenario))
        first = (known.unexplained(o.scenario, o.problems) or o.problems or [""])[0]
        rows.append([o.scenario.id, result, round(o.seconds, 1), points, first[:120]])
        entries.append(
            {
                "scenario": o.scenario.row,
                "id": o.scenario.id,
                "result": result,
                "seconds": round(o.seconds, 2),
                "known_bugs": [b.point for b in known.applicable(o.scenario)],
                "problems": o.problems,
                "notes": o.notes,
            }
        )
    print(markdown_table(["scenario", "result", "time s", "known bugs", "first problem"], rows))
    counts = collections.Counter(e["result"] for e in entries)
    aborted = sum(1 for b in matrix.batches for rec in b.launches if rec.get("aborted"))
    summary = ", ".join(f"{counts[k]} {k}" for k in ("pass", "xfail", "XPASS", "FAIL") if counts[k])
    print(
        f"\n{len(entries)} scenarios: {summary}; {matrix.launches} launches, {wall:.0f} s wall, "
        f"{matrix.cpu_seconds:.0f} s CPU; {aborted} launches had a rank end in SIGABRT (issue 18)"
    )
    report = new_report(
        "scenarios",
        argv,
        design=args.design,
        wall_seconds=round(wall, 1),
        cpu_seconds=round(matrix.cpu_seconds, 1),
        launches=matrix.launches,
        aborted_launches=aborted,
        counts=dict(counts),
        scenarios=entries,
    )
    print(f"wrote {write_json(args.out, report)}")
    return 1 if counts["FAIL"] or counts["XPASS"] else 0
