"""The scenario matrix (issue 11): features run together, the way users run them, interrupted
and resumed in real processes, compared with the uninterrupted run.

One test per scenario of the pairwise design (`scenario_designs.ci_scenarios`). The module's
fixture runs every selected scenario once, batching the jobs of one layout into few launches
(`scenario_harness`), so `-k` selects scenarios cheaply. A scenario a known bug breaks is a strict
xfail naming the issue point (`scenario_known`): when the fix lands it XPASSes and fails the
suite until its entry is removed.

    python -m pytest -q tests/scenarios                       # the CI design (a few minutes)
    python -m pytest -q tests/scenarios -k "sigterm and ddp"  # a few scenarios
    FUNCTRAIN_SCENARIOS_KEEP=1 python -m pytest ...           # keep the runs' files, print where

The runs' files are also kept (and their folder printed) when a scenario fails unexpectedly.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import scenario_known as known
from scenario_axes import AXES, FORBIDDEN
from scenario_covering import missing
from scenario_designs import ci_scenarios, executed_rows
from scenario_harness import run_matrix

SCENARIOS = ci_scenarios()


def scratch_root() -> str:
    """A fresh directory for the runs: in memory (/dev/shm) where there is one, since every
    checkpoint fsyncs and a disk makes that the slowest part of a tiny run."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="functrain-scenarios-", dir=base)


@pytest.fixture(scope="module")
def outcomes(request):
    wanted = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec and "scenario" in callspec.params:
            wanted.add(callspec.params["scenario"].id)
    selected = [s for s in SCENARIOS if s.id in wanted]
    root = scratch_root()
    keep = bool(os.environ.get("FUNCTRAIN_SCENARIOS_KEEP"))
    try:
        outcomes = run_matrix(selected, root).outcomes
        # an unexplained failure keeps the runs' files (each launch's output) for a diagnosis
        keep = keep or any(
            o.problems
            and (not known.applicable(o.scenario) or known.unexplained(o.scenario, o.problems))
            for o in outcomes
        )
        yield {o.scenario.id: o for o in outcomes}
    finally:
        if keep:
            print(f"\nscenario runs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario", [pytest.param(s, id=s.id, marks=known.marks(s)) for s in SCENARIOS]
)
def test_scenario(scenario, outcomes):
    outcome = outcomes[scenario.id]
    known.raise_for(scenario, outcome.problems)


def test_the_ci_design_covers_every_pair_of_axis_values():
    # Checked by brute force over the rows that run (scenarios and their references), not by
    # the generator's own bookkeeping.
    assert missing(executed_rows(SCENARIOS), AXES, 2, FORBIDDEN) == []
    for scenario in SCENARIOS:  # and no scenario holds an impossible pair
        assert not any(rule.hit_by(scenario.row) for rule in FORBIDDEN), scenario.id


def test_every_known_bug_names_its_issue_point_and_is_used():
    for bug in known.KNOWN:
        assert bug.point.startswith(("11.", "29.", "30.")) and bug.fixed_by and bug.symptom
        assert any(bug.applies(s) for s in SCENARIOS), f"{bug.point} applies to no CI scenario"


@pytest.mark.slow
def test_a_script_without_a_mesh_under_the_launcher_is_data_parallel_or_refuses():
    # The README's promise: a script written for one process runs unchanged on many. Composer
    # and Lightning then train data-parallel; failing with a clear error is acceptable too.
    from scenario_axes import Scenario
    from scenario_checks import why_failed
    from scenario_harness import run_batch
    from scenario_jobs import Batch, plan, read_progress

    root = scratch_root()
    try:
        scenario = Scenario("none", "fp32", "ddp", "off", "ba", "plain", "none")
        batches, by_scenario = plan([scenario], root)
        first = batches[0]
        batch = Batch("no_mesh", first.dir, "ddp", first.jobs, mesh=False, digits=first.digits)
        run_batch(batch)
        ref, _ = by_scenario[scenario.id]
        if os.path.exists(os.path.join(ref.dir, "failed")):
            message = why_failed(ref)
            if "mesh" in message or "launch" in message:
                return  # refused, saying why: acceptable
            raise AssertionError(f"2 ranks without a mesh collided: {message}")
        records = [r for r in read_progress(ref.dir) if "step" in r]
        sizes = {r["local"] for r in records}
        steps = [r["step"] for r in records]
        if sizes != {8} or len(steps) != len(set(steps)):
            raise AssertionError(
                f"2 ranks without a mesh: local batches of {sorted(sizes)} samples (want 8 of "
                f"the 16), {len(steps)} step records for {len(set(steps))} steps (each rank "
                "believes it is rank 0)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
