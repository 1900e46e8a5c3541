"""`python -m bench scenarios`: the scenario matrix of issue 11, bigger than CI runs it.

CI (`python -m pytest tests/scenarios`) runs a pairwise design: every two axis values meet in some
scenario. This command runs a strength-3 covering design by default (every three values meet,
246 scenarios), or the whole cross product (`--design full`, 8,568 interrupted scenarios), with
the same harness and checks (tests/scenarios/scenario_harness.py), and prints one row per
scenario: result, time, the known bugs that apply, and the first problem found.

The full product takes hours, so it runs in pieces that add up (tests/scenarios/
scenario_ledger.py): results accumulate in one ledger (`--results`, by default
bench/results/scenarios_full.json) keyed by scenario id, with the code hash and git commit of
each row, saved after every training configuration; `--resume` skips rows already done at
today's code hash; `--only` and `--shard i/n` choose a slice; `--max-minutes` stops in time;
`--report` prints the table and the totals (ran, pass, fail, remaining, hours left) without
running anything. Uninterrupted references are cached by configuration and code hash (`--cache`).

Results: `pass`; `xfail` (failed, and every problem is explained by the known bugs listed, see
tests/scenarios/scenario_known.py); `XPASS` (a known bug applies but the scenario passed: its fix
landed, update the table); `FAIL` (a problem no known bug explains).

Example:
    python -m bench scenarios                         # strength 3
    python -m bench scenarios --design ci             # what CI runs
    python -m bench scenarios --only sigterm,ddp      # ids holding every given axis value
    nice -n 15 python -m bench scenarios --design full --resume --only single --max-minutes 60
    python -m bench scenarios --design full --resume --shard 2/4     # a quarter of the rest
    python -m bench scenarios --design full --report  # where the full run stands
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time

from bench.common import (
    RESULTS_DIR,
    environment,
    log,
    markdown_table,
    new_report,
    timestamp,
    write_json,
)

SCENARIO_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "scenarios"
)


FULL_RESULTS = os.path.join(RESULTS_DIR, "scenarios_full.json")
DEFAULT_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "functrain", "scenario_refs"
)


def _import_harness():
    if SCENARIO_DIR not in sys.path:
        sys.path.insert(0, SCENARIO_DIR)
    import scenario_designs
    import scenario_harness
    import scenario_known

    return scenario_designs, scenario_harness, scenario_known


def _import_ledger():
    if SCENARIO_DIR not in sys.path:
        sys.path.insert(0, SCENARIO_DIR)
    import scenario_jobs
    import scenario_ledger

    return scenario_jobs, scenario_ledger


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m bench scenarios", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--design", default="3", choices=("ci", "2", "3", "full"),
                        help="ci/2: pairwise; 3: every triple of axis values; full: the cross product")  # fmt: skip
    parser.add_argument("--only", default="",
                        help="comma-separated axis values (or dotted id pieces) every chosen id holds")  # fmt: skip
    parser.add_argument("--limit", type=int, default=0, help="run at most this many scenarios")
    parser.add_argument("--root", default=None, help="where the runs go (default: a scratch dir)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' files")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "scenarios.json"))
    parser.add_argument("--results", default=None,
                        help=f"the ledger the rows accumulate in (default for --design full: {FULL_RESULTS})")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="skip the ledger's rows done at today's code hash")  # fmt: skip
    parser.add_argument(
        "--retry-failed", action="store_true", help="with --resume: rerun FAIL rows"
    )
    parser.add_argument("--shard", default=None, help="i/n: the i-th of n shards (1-based)")
    parser.add_argument("--report", action="store_true", help="print the ledger's table and totals; run nothing")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, default=0.0,
                        help="start no new configuration after this many minutes")  # fmt: skip
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="the uninterrupted references' cache ('' for none)")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=None,
                        help="batches at once (default 2; 1 with a ledger: one scenario at a time)")  # fmt: skip
    parser.add_argument("--profile", action="store_true",
                        help="print where the launches' time went (by phase)")  # fmt: skip
    parser.add_argument("--no-fork", action="store_true",
                        help="a new interpreter for every one-process launch")  # fmt: skip
    args = parser.parse_args(argv)
    if args.results is None and args.design == "full":
        args.results = FULL_RESULTS
    return args


def classify(known, scenario, problems) -> str:
    bugs = known.applicable(scenario)
    if not problems:
        return "XPASS" if bugs else "pass"
    if bugs and not known.unexplained(scenario, problems):
        return "xfail"
    return "FAIL"


def select(args) -> list:
    """The design's scenarios that `--only`, `--shard` and `--limit` choose."""
    designs, _, _ = _import_harness()
    _, ledger = _import_ledger()
    if args.design in ("ci", "2"):
        scenarios = designs.ci_scenarios()
    elif args.design == "3":
        scenarios = designs.scenarios_of_strength(3)
    else:
        scenarios = designs.all_scenarios()
    parts = [p for p in args.only.split(",") if p]
    scenarios = [s for s in scenarios if ledger.matches(s, parts)]
    if args.shard:
        scenarios = ledger.shard(scenarios, *ledger.parse_shard(args.shard))
    if args.limit:
        scenarios = scenarios[: args.limit]
    return scenarios


def main(argv=None) -> int:
    args = parse_args(argv or [])
    try:
        scenarios = select(args)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if not scenarios:
        print("no scenario matches", file=sys.stderr)
        return 2
    if args.results:
        return run_ledger(args, argv or [], scenarios)
    designs, harness, known = _import_harness()
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = args.root or tempfile.mkdtemp(prefix="functrain-scenarios-", dir=base)
    log(f"{len(scenarios)} scenarios (design {args.design}) under {root}")
    started = time.monotonic()
    try:
        matrix = harness.run_matrix(
            scenarios, root, log=log, parallel=args.parallel or 2, forks=not args.no_fork,
            ref_cache=args.cache or None,
        )  # fmt: skip
        if args.profile:
            print_phases(phase_seconds(root))
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


# -- where the time goes ------------------------------------------------------------------------

PHASES = {
    "imported": "interpreter start + imports",
    "group": "process group + mesh",
    "built": "build (init, make_step; the first one imports DTensor)",
    "fit_start": "fit setup + restore",
    "checkpoint": "training steps + checkpoint saves",
    "fit_end": "training steps + checkpoint saves",
    "final": "final state gathered + written",
    "exit": "between jobs",
}


def phase_seconds(root: str) -> collections.Counter:
    """Wall seconds per phase over every launch under `root` (kept runs): from each batch's
    launch records and the workers' timelines (scenario_worker.Timeline). A launch's processes
    form waves (a torchrun restart starts a second one); each wave is read on its first process.
    """
    import json

    total: collections.Counter = collections.Counter()
    for folder, _, names in os.walk(root):
        if "launches.json" not in names:
            continue
        with open(os.path.join(folder, "launches.json")) as f:
            launches = json.load(f)
        timelines = []
        timing = os.path.join(folder, "timing")
        for name in sorted(os.listdir(timing)) if os.path.isdir(timing) else []:
            with open(os.path.join(timing, name)) as f:
                marks = [json.loads(line) for line in f if line.strip()]
            if marks and marks[0]["mark"] == "start" and marks[0]["t"]:
                timelines.append(marks)
        for rec in launches:
            began, ended = rec["began"], rec["ended"]
            mine = sorted(
                (m for m in timelines if began - 0.5 <= m[0]["t"] <= ended), key=lambda m: m[0]["t"]
            )
            waves: list[list] = []
            for marks in mine:
                if waves and marks[0]["t"] - waves[-1][0][0]["t"] < 1.0:
                    waves[-1].append(marks)
                else:
                    waves.append([marks])
            t = began
            for wave in waves:
                first = wave[0]
                label = "launcher start" if t == began else "torchrun restart"
                total[label] += max(0.0, first[0]["t"] - t)
                t = first[0]["t"]
                for mark in first[1:]:
                    total[PHASES[mark["mark"]]] += max(0.0, mark["t"] - t)
                    t = max(t, mark["t"])
                ends = [m[-1]["t"] for m in wave]
                t = max(t, max(ends))
            label = "exit / kill / teardown" if waves else "unattributed"
            total[label] += max(0.0, ended - t)
    return total


def print_phases(total: collections.Counter) -> None:
    wall = sum(total.values())
    rows = [[k, round(v, 1), f"{100 * v / wall:.0f}%"] for k, v in total.most_common()]
    print(
        markdown_table(["phase", "seconds", "share"], rows + [["all launches", round(wall, 1), ""]])
    )


# -- the ledger: a long run in pieces ------------------------------------------------------------


def _git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=os.path.dirname(SCENARIO_DIR),
        )  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def print_report(scenarios, ledger_data, code, table: bool = True) -> dict:
    _, ledger = _import_ledger()
    if table:
        rows = ledger.table_rows(scenarios, ledger_data, code)
        print(markdown_table(["scenario", "result", "time s", "first problem"], rows))
        print()
    print(
        markdown_table(
            ["layout", "scenarios", "ran", "pass", "fail", "remaining"],
            ledger.by_layout(scenarios, ledger_data, code),
        )
    )
    t = ledger.totals(scenarios, ledger_data, code)
    hours = f"{t['hours_left']:.1f} h"
    print(
        f"\n{t['scenarios']} scenarios at code {code}: {t['ran']} ran, {t['pass']} pass, "
        f"{t['xfail']} xfail, {t['fail']} fail, {t['remaining']} remaining "
        f"(estimated {hours} left at {t['seconds_per_scenario']} s a scenario measured, "
        f"{ledger.PRIOR_SECONDS} before a layout has rows)"
    )
    return t


def run_ledger(args, argv, scenarios) -> int:
    """Run the chosen scenarios one training configuration at a time, saving each one's rows
    into the ledger as it finishes (see scenario_ledger.py)."""
    designs, harness, known = _import_harness()
    jobs, ledger = _import_ledger()
    from scenario_forkserver import ForkServer

    code = jobs.code_hash()
    data = ledger.load(args.results, args.design)
    if args.report:
        t = print_report(scenarios, data, code)
        return 1 if t["fail"] else 0
    todo = ledger.pending(scenarios, data, code, args.retry_failed) if args.resume else scenarios
    units = ledger.units(todo)
    log(f"{len(todo)} of {len(scenarios)} chosen scenarios to run ({len(units)} configurations) "
        f"at code {code}; ledger {args.results}")  # fmt: skip
    commit = _git_commit()
    run_info = {"started": timestamp(), "command": ["python", "-m", "bench", "scenarios", *argv],
                "code_hash": code, "git_commit": commit, "scenarios": 0, "wall_seconds": 0.0}  # fmt: skip
    data["runs"].append(run_info)
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    started = time.monotonic()
    needs_forks = not args.no_fork and bool(todo)
    server = ForkServer(harness.clean_env(), harness.REPO) if needs_forks else None
    stopped = None
    phases: collections.Counter = collections.Counter()
    try:
        for n, unit in enumerate(units):
            if args.max_minutes and time.monotonic() - started > 60 * args.max_minutes:
                stopped = f"--max-minutes {args.max_minutes:g} reached"
                break
            if jobs.code_hash.__wrapped__() != code:  # an edit under a running slice
                stopped = "the code changed under the run (its hash no longer matches)"
                break
            root = args.root or tempfile.mkdtemp(prefix="functrain-scenarios-", dir=base)
            unit_root = os.path.join(root, f"unit{n}") if args.root else root
            unit_started = time.monotonic()
            try:
                matrix = harness.run_matrix(
                    unit, unit_root, log=log, parallel=args.parallel or 1,
                    forks=server if server else False, ref_cache=args.cache or None,
                )  # fmt: skip
                if args.profile:
                    phases += phase_seconds(unit_root)
            finally:
                if not args.keep:
                    shutil.rmtree(unit_root if args.root else root, ignore_errors=True)
            wall = time.monotonic() - unit_started
            rows = []
            for o in matrix.outcomes:
                result = classify(known, o.scenario, o.problems)
                rows.append({
                    "id": o.scenario.id, "scenario": o.scenario.row, "result": result,
                    "seconds": round(wall / len(matrix.outcomes), 2),
                    "job_seconds": round(o.seconds, 2),
                    "code_hash": code, "git_commit": commit, "finished": timestamp(),
                    "known_bugs": [b.point for b in known.applicable(o.scenario)],
                    "problems": o.problems, "notes": o.notes,
                })  # fmt: skip
            ledger.record(data, rows)
            run_info["scenarios"] += len(rows)
            run_info["wall_seconds"] = round(time.monotonic() - started, 1)
            data["environment"] = environment()
            ledger.save(args.results, data)
            bad = [r["id"] for r in rows if r["result"] in ("FAIL", "XPASS")]
            log(f"unit {n + 1}/{len(units)} {unit[0].config_id}: {len(rows)} scenarios in "
                f"{wall:.0f} s{'; FAIL: ' + ', '.join(bad) if bad else ''}")  # fmt: skip
    finally:
        if server is not None:
            server.close()
        run_info["wall_seconds"] = round(time.monotonic() - started, 1)
        if stopped:
            run_info["stopped"] = stopped
        ledger.save(args.results, data)
    if stopped:
        log(f"stopped: {stopped}")
    if args.profile:
        print_phases(phases)
    t = print_report(scenarios, data, code, table=False)
    return 1 if t["fail"] else 0
