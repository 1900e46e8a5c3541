"""The scenario matrix's jobs and batches, and what a job leaves in its directory.

A job is one training run (an uninterrupted reference, or an interrupted run) in its own
directory; a batch is the jobs one process (or one launch of the ranks) trains in turn. `plan`
turns scenarios into both. The helpers below read what the worker (scenario_worker.py) wrote.

Example:
    >>> batches, by_scenario = plan(scenarios, "/dev/shm/run")
    >>> reference, interrupted = by_scenario[scenarios[0].id]
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence

from scenario_axes import MULTI_RANK, Scenario

TOTAL_STEPS = 18  # scenario_worker: 96 samples / 16 a batch * 3 epochs
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The files that decide what a scenario runs and how it is judged (besides functrain itself):
# a change to any of them changes `code_hash`. The designs, the known-bug table and the
# bookkeeping of results choose and label scenarios; they do not change one.
HARNESS_FILES = (
    "scenario_axes.py",
    "scenario_checks.py",
    "scenario_forkserver.py",
    "scenario_harness.py",
    "scenario_jobs.py",
    "scenario_timeline.py",
    "scenario_worker.py",
)


@functools.cache
def code_hash(repo: str = REPO) -> str:
    """A digest of everything a scenario's result depends on: every file of the functrain
    package, the harness files above, the Python and torch versions. Results and cached
    references are reused only under the same hash."""
    from importlib import metadata

    digest = hashlib.sha256()
    files = []
    for folder, dirs, names in os.walk(os.path.join(repo, "functrain")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [os.path.join(folder, n) for n in names if not n.endswith((".pyc", ".pyo"))]
    files += [os.path.join(repo, "tests", "scenarios", n) for n in HARNESS_FILES]
    for path in sorted(files):
        digest.update(os.path.relpath(path, repo).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    digest.update(f"python {sys.version_info[:3]} torch {metadata.version('torch')}".encode())
    return digest.hexdigest()[:16]


# -- jobs and batches ----------------------------------------------------------------------------


@dataclasses.dataclass
class Job:
    """One training run (a reference or an interrupted run) in its own directory."""

    id: str
    dir: str
    config: dict
    events: list[dict]
    layout: str
    phase: str = "first"  # "resumed": the part of a rank change that runs on the other layout


@dataclasses.dataclass
class Batch:
    """Jobs that one process (or one launch) trains one after the other."""

    name: str
    dir: str
    layout: str
    jobs: list[Job]
    mesh: bool = True  # False: run the one-process script unchanged under the launcher
    digits: str | None = None  # scikit-learn's digits as .npz (see `write_digits`)
    launches: list[dict] = dataclasses.field(default_factory=list)


def _job_dir(root: str, job_id: str) -> str:
    return os.path.join(root, "jobs", job_id)


def plan(
    scenarios: Sequence[Scenario], root: str
) -> tuple[list[Batch], dict[str, tuple[Job, Job | None]]]:
    """The batches to run, and for each scenario id its (reference, interrupted run) jobs."""
    refs: dict[str, Job] = {}
    runs: dict[str, Job] = {}
    by_scenario: dict[str, tuple[Job, Job | None]] = {}
    for s in scenarios:
        ref_id = "ref." + s.config_id
        ref = refs.setdefault(ref_id, Job(ref_id, _job_dir(root, ref_id), s.config, [], s.layout))
        run = None
        if s.interruption != "none":
            event = {"kind": s.interruption, "at": s.event_step(TOTAL_STEPS)}
            run = runs.setdefault(
                s.id, Job(s.id, _job_dir(root, s.id), s.config, [event], s.layout)
            )
        by_scenario[s.id] = (ref, run)
    batches: list[Batch] = []
    digits = write_digits(os.path.join(root, "digits.npz"))
    layouts = ["single", *MULTI_RANK]
    for layout in layouts:
        jobs = [j for j in refs.values() if j.layout == layout]
        jobs += [j for j in runs.values() if j.layout == layout]
        if jobs:
            batches.append(
                Batch(layout, os.path.join(root, "batches", layout), layout, jobs, digits=digits)
            )
    moved = [j for j in runs.values() if j.events[0]["kind"] == "rank_change"]
    if moved:
        resumed = [
            dataclasses.replace(j, events=[], layout="single", phase="resumed") for j in moved
        ]
        folder = os.path.join(root, "batches", "resume_on_1")
        batches.append(Batch("resume_on_1", folder, "single", resumed, digits=digits))
    return batches, by_scenario


# -- the reference cache -------------------------------------------------------------------------

REFERENCE_FILES = ("progress.jsonl", "final.safetensors", "final.json", "seconds", "done")


def reference_key(job: Job) -> str:
    """What determines an uninterrupted reference: its configuration (the layout included), the
    run's length and `code_hash()`; interruptions do not enter (a reference has none)."""
    if job.events or job.phase != "first":
        raise ValueError(f"{job.id} is not an uninterrupted reference")
    what = {"config": job.config, "layout": job.layout, "steps": TOTAL_STEPS, "code": code_hash()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def restore_reference(job: Job, cache: str) -> bool:
    """Fill `job.dir` from the cache; True when the reference was there (then it is done)."""
    source = os.path.join(cache, reference_key(job))
    if not all(os.path.exists(os.path.join(source, n)) for n in REFERENCE_FILES):
        return False
    os.makedirs(job.dir, exist_ok=True)
    for name in REFERENCE_FILES:
        shutil.copyfile(os.path.join(source, name), os.path.join(job.dir, name))
    return True


def store_reference(job: Job, cache: str) -> None:
    """Copy a finished reference's results (not its checkpoints) into the cache, atomically."""
    target = os.path.join(cache, reference_key(job))
    if os.path.isdir(target) or finished(job) != "done":
        return
    staging = f"{target}.tmp{os.getpid()}"
    os.makedirs(staging, exist_ok=True)
    for name in REFERENCE_FILES:
        shutil.copyfile(os.path.join(job.dir, name), os.path.join(staging, name))
    try:
        os.rename(staging, target)
    except OSError:  # stored meanwhile by another run: keep that one
        shutil.rmtree(staging, ignore_errors=True)


def write_digits(path: str) -> str:
    """scikit-learn's digits training split as an .npz at `path`, for the workers to share."""
    import numpy as np

    from functrain import datasets

    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        images, labels = datasets.digits(seed=0).train.tensors
        np.savez(path + ".tmp.npz", images=images.numpy(), labels=labels.numpy())
        os.replace(path + ".tmp.npz", path)
    return path


def finished(job: Job) -> str | None:
    names = ("done", "failed") if job.phase == "resumed" else ("done", "moved", "failed")
    for name in names:
        if os.path.exists(os.path.join(job.dir, name)):
            return name
    return None


def fired(job: Job) -> set[int]:
    folder = os.path.join(job.dir, "events")
    if not os.path.isdir(folder):
        return set()
    return {int(n.split(".")[0]) for n in os.listdir(folder) if n.endswith(".fired")}


def tail(path: str, n: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def committed_steps(root: str) -> list[int]:
    """The steps of the committed checkpoints under `root` (functrain's public listing)."""
    from functrain.checkpoint import checkpoints

    if not os.path.isdir(root):
        return []
    return [step for step, _ in checkpoints(root)]


def read_progress(job_dir: str) -> list[dict]:
    """The progress records (a SIGKILL may have cut the last line short: it is skipped)."""
    path = os.path.join(job_dir, "progress.jsonl")
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def last_recorded_step(job: Job) -> int:
    steps = [r["step"] for r in read_progress(job.dir) if "step" in r]
    return steps[-1] if steps else 0
