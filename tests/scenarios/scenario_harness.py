"""Runs scenarios in real processes and compares each interrupted run with its reference.

`run_matrix(scenarios, root)` plans the work and returns one `Outcome` per scenario:

1. Jobs. Each scenario's training configuration gets one uninterrupted reference job (shared by
   every scenario with that configuration and layout); each interrupted scenario gets one more job,
   with its interruption aimed at a step drawn from the scenario's id.
2. Batches. The jobs of one layout form a batch, run by one process (or one launch of 2 ranks,
   or two launchers for the two-node layout) that trains them one after the other. An interruption
   ends the process, so the harness launches the batch again and every job auto-resumes: a batch
   costs one launch per process-ending interruption, plus one. The runs that resume on a different
   number of ranks go on in a last, one-process batch.
3. Checks (scenario_checks.py): each interrupted run against its reference, bit for bit on the
   same number of ranks, within a tolerance across rank counts, plus what each interruption must
   leave behind.

Jobs and batches are in scenario_jobs.py. Everything a run leaves (checkpoints, progress, the
output of each launch, each launch's record in `launches.json` and each process's timeline)
stays under `root`. A launch's first process -- the one process of the one-process layout, the
launcher(s) of the others -- forks from a warm server (scenario_forkserver.py), which saves the
interpreter's start, the imports and the finalization of each; torchrun still starts every rank
as a new interpreter, and every signal and kill reaches a real process.

Example:
    >>> matrix = run_matrix([Scenario.from_row(row)], "/dev/shm/scenarios")
    >>> matrix.outcomes[0].problems
    []
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from scenario_axes import Scenario
from scenario_checks import (
    Outcome,
    check_interruption,
    check_reference,
    compare_runs,
    job_seconds,
    why_failed,
)
from scenario_forkserver import ForkServer
from scenario_jobs import (
    Batch,
    committed_steps,
    finished,
    fired,
    last_recorded_step,
    plan,
    restore_reference,
    store_reference,
    tail,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "scenario_worker.py")
LAUNCH_TIMEOUT = 240.0  # seconds for one launch of a batch (a hang is killed and reported)
# What a rank that ends in SIGABRT prints (issue 18): noted on the scenarios of that launch, not
# failed, since the abort is intermittent and a strict xfail cannot follow it.
ABORT_MARKERS = ("terminate called without an active exception", "Fatal Python error: Aborted")


def clean_env() -> dict:
    """This environment without any launcher's variables, importing this checkout."""
    drop = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    env = {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCHELASTIC")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commands(batch: Batch, batch_file: str, restarts: int) -> list[list[str]]:
    py = sys.executable
    if batch.layout == "single":
        return [[py, WORKER, batch_file]]
    launch = [py, "-m", "functrain.launch", "--max-restarts", str(restarts)]
    if batch.layout == "two_nodes":
        port = str(_free_port())
        return [
            [*launch, "-n", "1", "--nnodes", "2", "--node-rank", str(node),
             "--master-addr", "127.0.0.1", "--master-port", port, WORKER, batch_file]
            for node in (0, 1)
        ]  # fmt: skip
    return [[*launch, "-n", "2", WORKER, batch_file]]


def _kill_all(procs: list[subprocess.Popen], pid_dir: str) -> None:
    """SIGKILL the launch: its launchers and the ranks they started (their pids are on file)."""
    pids = [p.pid for p in procs if p.poll() is None]
    if os.path.isdir(pid_dir):
        for name in os.listdir(pid_dir):
            if name.startswith("rank"):
                try:
                    pids.append(int(Path(os.path.join(pid_dir, name)).read_text()))
                except ValueError:
                    pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_batch(
    batch: Batch, log: Callable[[str], None] = lambda s: None, forks: ForkServer | None = None
) -> None:
    """Launch `batch` until every job finished (or failed); records each launch.

    Args:
        batch: the jobs and their layout.
        log: receives a line per launch.
        forks: where a launch's processes fork from (scenario_forkserver.py): the one process
            of the one-process layout, the launcher(s) of the others (whose ranks torchrun
            starts as new interpreters); None: a new interpreter for each.
    """
    log(f"batch {batch.name}: {len(batch.jobs)} jobs")
    os.makedirs(batch.dir, exist_ok=True)
    for job in batch.jobs:
        os.makedirs(job.dir, exist_ok=True)
    batch_file = os.path.join(batch.dir, "batch.json")
    spec = {
        "dir": batch.dir,
        "layout": batch.layout,
        "nodes": 2 if batch.layout == "two_nodes" else 1,
        "mesh": batch.mesh,
        "digits": batch.digits,
        "jobs": [dataclasses.asdict(j) for j in batch.jobs],
    }
    with open(batch_file, "w") as f:
        json.dump(spec, f, indent=1)
    pid_dir = os.path.join(batch.dir, "pids")
    budget = 2 + sum(len(j.events) for j in batch.jobs) * 2
    for attempt in range(budget):
        pending = [j for j in batch.jobs if finished(j) is None]
        if not pending:
            return
        fired_before = {j.id: fired(j) for j in batch.jobs}
        restarts = sum(
            1
            for j in pending
            for i, e in enumerate(j.events)
            if e["kind"] == "restart" and i not in fired_before[j.id]
        )
        shutil.rmtree(pid_dir, ignore_errors=True)
        os.makedirs(pid_dir)
        current = os.path.join(batch.dir, "current")
        if os.path.exists(current):
            os.remove(current)
        outputs, procs = [], []
        began = time.time()  # wall time: the workers' timelines (scenario_worker.Timeline) use it
        started = time.monotonic()
        for node, command in enumerate(_commands(batch, batch_file, restarts)):
            out = os.path.join(batch.dir, f"launch{attempt}.node{node}.out")
            outputs.append(out)
            if forks is not None and batch.layout == "single":
                procs.append(forks.launch(command[1:], out))
            elif forks is not None:  # command: python -m functrain.launch ARGS
                procs.append(forks.launch(["functrain.launch", *command[3:]], out, "launch"))
            else:
                with open(out, "w") as f:
                    procs.append(
                        subprocess.Popen(
                            command, stdout=f, stderr=subprocess.STDOUT, env=clean_env(),
                            cwd=REPO, start_new_session=True,
                        )
                    )  # fmt: skip
            if batch.layout != "single":
                with open(os.path.join(pid_dir, f"launcher{node}"), "w") as f:
                    f.write(str(procs[-1].pid))
        timed_out = False
        deadline = started + LAUNCH_TIMEOUT
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_all(procs, pid_dir)
                proc.wait()
        seconds = time.monotonic() - started
        running = Path(current).read_text().strip() if os.path.exists(current) else None
        fired_now = {
            j.id: sorted(fired(j) - fired_before[j.id])
            for j in batch.jobs
            if fired(j) - fired_before[j.id]
        }
        record = {
            "attempt": attempt,
            "rcs": [p.returncode for p in procs],
            "seconds": round(seconds, 2),
            "began": began,
            "ended": time.time(),
            "timed_out": timed_out,
            "outputs": outputs,
            "running": running,
            "fired": fired_now,
            "finished": [j.id for j in batch.jobs if finished(j) and j in pending],
            "checkpoints": {},
            "last_step": {},
        }
        text = "".join(tail(o, 1_000_000) for o in outputs)
        record["aborted"] = any(marker in text for marker in ABORT_MARKERS)
        for job_id in fired_now:  # what the interruption left, before anything resumes
            job = next(j for j in batch.jobs if j.id == job_id)
            record["checkpoints"][job_id] = committed_steps(os.path.join(job.dir, "ckpt"))
            record["last_step"][job_id] = last_recorded_step(job)
        batch.launches.append(record)
        with open(os.path.join(batch.dir, "launches.json"), "w") as f:
            json.dump(batch.launches, f, indent=1)
        log(
            f"  {batch.name} launch {attempt}: rc={record['rcs']} {seconds:.1f}s"
            f"{' TIMEOUT' if timed_out else ''} fired={fired_now} finished={record['finished']}"
        )
        if not fired_now and not record["finished"]:  # no progress: give up on the running job
            culprit = next((j for j in pending if j.id == running), pending[0])
            output = "".join(tail(o, 3000) for o in outputs)
            with open(os.path.join(culprit.dir, "failed"), "w") as f:
                f.write(f"launch {attempt} made no progress (rc={record['rcs']}, "
                        f"timed out={timed_out}):\n{output}")  # fmt: skip
    for job in batch.jobs:
        if finished(job) is None:
            with open(os.path.join(job.dir, "failed"), "w") as f:
                f.write(f"not finished after {budget} launches")


@dataclasses.dataclass
class MatrixRun:
    """The outcomes of `run_matrix`, with what running them cost."""

    outcomes: list[Outcome]
    batches: list[Batch]
    wall_seconds: float
    cpu_seconds: float  # of every process the harness started (user + system)

    @property
    def launches(self) -> int:
        return sum(len(b.launches) for b in self.batches)


def run_matrix(
    scenarios: Iterable[Scenario],
    root: str,
    log: Callable[[str], None] = lambda s: None,
    parallel: int = 2,
    forks: ForkServer | bool = True,
    ref_cache: str | None = None,
) -> MatrixRun:
    """Run `scenarios` under `root` and check each one (see the module docstring).

    Args:
        scenarios: what to run.
        root: an empty directory for the runs.
        log: receives a line per launch.
        parallel: batches run at once (they share nothing but the CPU; launches spend part of
            their time waiting: rendezvous, a signal's way through torchrun, a hang's timeout).
        forks: launches fork their first process (the one process, or the launchers) from a
            warm server (scenario_forkserver.py): True starts one for this call, a
            `ForkServer` is used as it is, False starts a new interpreter for each.
        ref_cache: a folder of finished uninterrupted references, keyed by everything that
            determines one (`reference_key`: the configuration and a hash of the code): a
            reference found there is not trained again, one trained here is added.
    """
    import concurrent.futures
    import resource

    scenarios = list(scenarios)
    batches, by_scenario = plan(scenarios, root)
    refs = {ref.id: ref for ref, _ in by_scenario.values()}
    cached = {j.id for j in refs.values() if ref_cache and restore_reference(j, ref_cache)}
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    first = [b for b in batches if b.name != "resume_on_1"]  # the resumes need the rest done
    last = [b for b in batches if b.name == "resume_on_1"]
    own_server = forks is True and bool(batches)
    server = ForkServer(clean_env(), REPO) if own_server else forks or None
    forked_cpu = server.cpu_seconds if server else 0.0
    try:
        for group in (first, last):
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
                for future in [pool.submit(run_batch, b, log, server) for b in group]:
                    future.result()
    finally:
        if own_server:
            server.close()
    if ref_cache:
        for job in refs.values():
            if job.id not in cached and finished(job) == "done":
                store_reference(job, ref_cache)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if server:  # forked launches are the server's children, not this process's
        cpu += server.cpu_seconds - forked_cpu
    wall = time.monotonic() - started
    launches = [rec for b in batches for rec in b.launches]
    outcomes = []
    for s in scenarios:
        ref, run = by_scenario[s.id]
        problems, notes = check_reference(s, ref), []
        if run is not None:
            more, notes = check_interruption(s, run, launches)
            problems += more
            if finished(run) != "done":
                problems.append(f"the interrupted run failed: {why_failed(run)}")
            elif finished(ref) == "done":
                problems += compare_runs(s, ref, run, notes)
        for rec in launches:
            if rec["aborted"] and (
                (run is not None and (run.id in rec["fired"] or rec["running"] == run.id))
                or rec["running"] == ref.id
            ):
                notes.append(
                    f"a rank aborted (SIGABRT, issue 18) in launch {rec['attempt']} of its batch"
                )
        if ref.id in cached:
            notes.append("its reference came from the cache (same configuration and code)")
        outcomes.append(Outcome(s, problems, notes, job_seconds(ref) + job_seconds(run)))
    log(f"{len(scenarios)} scenarios, {sum(len(b.launches) for b in batches)} launches: "
        f"{wall:.0f} s wall, {cpu:.0f} s CPU")  # fmt: skip
    return MatrixRun(outcomes, batches, wall, cpu)
