"""`python -m bench exits`: start short multi-rank runs many times and count unclean exits.

Each run is a few lines of the public API on N ranks (bench/exit_worker.py) that end without
any shutdown call, as a user's script does. A run is

    ok      every rank exited 0 with no gloo worker thread left at finalization;
    abort   a rank died of SIGABRT or printed `terminate called ...` (the bug functrain's
            teardown exists to prevent, see functrain/teardown.py);
    at-risk every rank exited 0, but a gloo worker thread was still alive when the interpreter
            finalized (what aborts when the race strikes; on a busy machine it rarely does,
            so this count is the deterministic one);
    hang    a rank was still alive after --timeout seconds (killed, with its Python stacks);
    failed  anything else (a Python error, another signal).

Ranks start in one of two ways:
    --via fork    this process imports functrain once and forks the N ranks of each run; each
                  rank sets the launcher's environment, runs the workload, and leaves through
                  ordinary interpreter exit (atexit, finalization). Cheap: CI runs this form.
    --via launch  `python -m functrain.launch -n N bench/exit_worker.py ...`: torchrun, the
                  worker wrapper and the launcher's failure line, exactly as a user runs it.

Presets:
    --short   30 fork runs of 2-rank `fit` (CI, `.ci/run`)
    --long    the note's form: 200 runs of 2-rank `fsdp_ckpt` and 50 of 3-rank `fit`

Example:
    python -m bench exits --short
    python -m bench exits --runs 50 --ranks 3 --workload fsdp_ckpt --via launch
    python -m bench exits --runs 30 --no-teardown      # what happens without functrain's teardown
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass

from bench.exit_worker import EXIT_CHECK, WORKLOADS

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTCOMES = ("ok", "abort", "at-risk", "hang", "failed")
_ABORT_MARKERS = ("terminate called", "Fatal Python error: Aborted", "SIGABRT", "Signal 6")


@dataclass(frozen=True)
class Series:
    """Runs of one kind: `runs` times `workload` on `ranks` ranks started `via` fork/launch."""

    workload: str
    ranks: int
    runs: int
    via: str


def classify(codes: list[int | None], text: str) -> str:
    """ok / abort / at-risk / hang / failed for one run, from each rank's exit code (None:
    killed after the timeout, negative: the signal) and the run's output."""
    if any(code is None for code in codes):
        return "hang"
    if any(code == -signal.SIGABRT for code in codes) or any(m in text for m in _ABORT_MARKERS):
        return "abort"
    if not all(code == 0 for code in codes):
        return "failed"
    counts = [line.rsplit(":", 1)[1].strip() for line in text.splitlines() if EXIT_CHECK in line]
    if not counts:
        return "failed"  # the exit check never ran: nothing was verified
    return "at-risk" if any(c != "0" for c in counts) else "ok"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fork_run(series: Series, directory: str, timeout: float, teardown: bool) -> tuple[str, str]:
    """One run of `series` with forked ranks; `(outcome, output)`."""
    port = _free_port()
    logs = [os.path.join(directory, f"rank{r}.log") for r in range(series.ranks)]
    pids = []
    for rank in range(series.ranks):
        pid = os.fork()
        if pid == 0:
            _fork_rank(series, rank, port, logs[rank], directory, timeout, teardown)
        pids.append(pid)
    codes = _wait_all(pids, timeout)
    text = ""
    for rank, log in enumerate(logs):
        with open(log, errors="replace") as f:
            text += "".join(f"[rank{rank}] {line}" for line in f)
    return classify(codes, text), text


def _fork_rank(series, rank, port, log, directory, timeout, teardown) -> None:
    """The child: run the workload as one rank, then leave through normal interpreter exit."""
    import faulthandler

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(series.ranks),
        LOCAL_WORLD_SIZE=str(series.ranks),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=False)  # stacks of a hang
    code = 0
    try:
        from bench.exit_worker import arrange_exit_check, run

        arrange_exit_check(teardown)

        run(series.workload, directory)
    except BaseException:  # noqa: BLE001 - report it like an uncaught error, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    faulthandler.cancel_dump_traceback_later()
    # SystemExit unwinds the parent's stack copy in this child up to the interpreter, which then
    # exits as a script does: threads joined, atexit handlers, finalization.
    raise SystemExit(code)


def _preload() -> None:
    """Import what the ranks use once, here, so that each forked rank starts in milliseconds."""
    import torch.distributed.tensor  # noqa: F401

    import functrain  # noqa: F401
    import functrain.checkpoint  # noqa: F401
    import functrain.parallel  # noqa: F401


def _wait_all(pids: list[int], timeout: float) -> list[int | None]:
    """Each child's exit code (negative: killed by that signal; None: killed after `timeout`)."""
    codes: dict[int, int | None] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if len(codes) < len(pids):
            if time.monotonic() > deadline:
                for pid in pids:
                    if pid not in codes:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        codes[pid] = None
                break
            time.sleep(0.02)
    return [codes[pid] for pid in pids]


def _launch_run(series: Series, directory: str, timeout: float, teardown: bool) -> tuple[str, str]:
    """One run of `series` through `python -m functrain.launch`; `(outcome, output)`."""
    if not teardown:
        raise SystemExit("--no-teardown works with --via fork only")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "functrain.launch", "-n", str(series.ranks)]
    argv += [os.path.join(HERE, "exit_worker.py"), "--workload", series.workload]
    argv += ["--dir", directory, "--exit-check"]
    try:
        proc = subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as error:
        out = (error.stdout or b"") + (error.stderr or b"")
        return "hang", out.decode(errors="replace") if isinstance(out, bytes) else out
    text = proc.stdout + proc.stderr
    return classify([proc.returncode], text), text


def run_series(series: Series, timeout: float, teardown: bool, keep: str | None) -> Counter:
    """Run `series`; print one line per unclean run (and its output's tail); the counts
    (plus `seconds`)."""
    counts: Counter = Counter()
    start = time.perf_counter()
    for index in range(series.runs):
        directory = tempfile.mkdtemp(prefix="functrain-exits-")
        try:
            runner = _fork_run if series.via == "fork" else _launch_run
            outcome, text = runner(series, directory, timeout, teardown)
        finally:
            if os.getpid() == _PARENT:  # (a forked rank never gets here: it exits in the child)
                shutil.rmtree(directory, ignore_errors=True)
        counts[outcome] += 1
        if outcome != "ok":
            print(f"  run {index + 1}: {outcome}", flush=True)
            print("    " + "\n    ".join(text.strip().splitlines()[-25:]), flush=True)
            if keep:
                with open(os.path.join(keep, f"{series.workload}_{index}.log"), "w") as f:
                    f.write(text)
    seconds = time.perf_counter() - start
    summary = ", ".join(f"{k} {counts[k]}" for k in OUTCOMES)
    print(
        f"{series.runs} x {series.workload} on {series.ranks} ranks via {series.via}: "
        f"{summary} ({seconds:.0f} s)",
        flush=True,
    )
    return Counter({**counts, "seconds": round(seconds)})


_PARENT = os.getpid()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench exits", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--short", action="store_true", help="CI: 30 fork runs of 2-rank fit")
    preset.add_argument("--long", action="store_true", help="200 fsdp_ckpt + 50 3-rank fit runs")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workload", choices=WORKLOADS, default="fit")
    parser.add_argument("--via", choices=("fork", "launch"), default="fork")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a hang")
    parser.add_argument("--no-teardown", action="store_true", help="unregister the exit hook")
    parser.add_argument("--keep-logs", default=None, help="a folder for unclean runs' output")
    parser.add_argument(
        "--out", default=None, help="JSON report (default bench/results/exits.json; none: --short)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the series; exit code 1 when any run was unclean."""
    global _PARENT
    _PARENT = os.getpid()
    args = build_parser().parse_args(argv)
    argv = list(sys.argv[2:] if argv is None else argv)
    if args.short:
        plan = [Series("fit", 2, 30, "fork")]
    elif args.long:
        plan = [
            Series("fsdp_ckpt", 2, 200, args.via),
            Series("fit", 3, 50, args.via),
        ]
    else:
        plan = [Series(args.workload, args.ranks, args.runs, args.via)]
    if args.keep_logs:
        os.makedirs(args.keep_logs, exist_ok=True)
    if any(series.via == "fork" for series in plan):
        _preload()
    results = []
    for series in plan:
        counts = run_series(series, args.timeout, not args.no_teardown, args.keep_logs)
        results.append({**asdict(series), **{k: counts[k] for k in (*OUTCOMES, "seconds")}})
    _report(results, args, argv)
    return 1 if any(r[k] for r in results for k in OUTCOMES if k != "ok") else 0


def _report(results: list[dict], args: argparse.Namespace, argv: list[str] | None) -> None:
    """Print the table; write the JSON report (not for --short unless --out is given)."""
    from bench.common import RESULTS_DIR, markdown_table, new_report, write_json

    columns = ("workload", "ranks", "via", "runs", *OUTCOMES, "seconds")
    print(markdown_table(columns, [[r[c] for c in columns] for r in results]))
    out = args.out or (None if args.short else os.path.join(RESULTS_DIR, "exits.json"))
    if out:
        report = new_report("exits", argv, teardown=not args.no_teardown, series=results)
        print(f"wrote {write_json(out, report)}")
