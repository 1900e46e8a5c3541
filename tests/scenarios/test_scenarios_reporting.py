"""`python -m bench scenarios` and the xfail bookkeeping: how outcomes are classified and raised,
and that an empty selection is refused (the runs themselves are what test_scenarios_matrix.py
checks)."""

from __future__ import annotations

import os
import sys

import pytest
import scenario_known as known
from scenario_axes import Scenario

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench import scenarios as bench_scenarios  # noqa: E402

CLEAN = Scenario("none", "fp32", "ddp", "off", "ba", "plain", "kill_step")
SIGINT = Scenario("none", "fp32", "ddp", "off", "ba", "plain", "sigint")
# A stand-in for a listed bug (the table is empty once every known bug is fixed).
SIGINT_BUG = known.KnownBug(
    "11.5",
    "loop",
    "Ctrl-C writes no checkpoint at the stop",
    lambda s: s.interruption == "sigint",
    r"after SIGINT \(Ctrl-C\)",
)


@pytest.fixture(autouse=True)
def one_known_bug(monkeypatch):
    monkeypatch.setattr(known, "KNOWN", [SIGINT_BUG])


def test_results_are_pass_xfail_xpass_or_fail():
    assert known.applicable(CLEAN) == [] and [b.point for b in known.applicable(SIGINT)] == ["11.5"]
    classify = bench_scenarios.classify
    assert classify(known, CLEAN, []) == "pass"
    assert classify(known, CLEAN, ["the loss of step 3 is 1.0"]) == "FAIL"
    explained = "after SIGINT (Ctrl-C) the run stopped after step 9 but its newest checkpoint is 8"
    assert classify(known, SIGINT, [explained]) == "xfail"
    assert classify(known, SIGINT, [explained, "the loss of step 3 is 1.0"]) == "FAIL"
    assert classify(known, SIGINT, []) == "XPASS"


def test_an_empty_selection_is_refused(capsys):
    assert bench_scenarios.main(["--design", "ci", "--only", "no-such-scenario"]) == 2
    assert "no scenario matches" in capsys.readouterr().err


def test_a_known_failure_raises_its_own_type_and_anything_else_fails():
    explained = "after SIGINT (Ctrl-C) the run stopped after step 9 but its newest checkpoint is 8"
    known.raise_for(CLEAN, [])
    with pytest.raises(known.KnownBugFailure):
        known.raise_for(SIGINT, [explained])
    with pytest.raises(AssertionError) as error:  # not explained by 11.5: a real failure
        known.raise_for(SIGINT, [explained, "final counters differ"])
    assert not isinstance(error.value, known.KnownBugFailure)
    with pytest.raises(AssertionError) as error:  # no known bug applies
        known.raise_for(CLEAN, [explained])
    assert not isinstance(error.value, known.KnownBugFailure)
    (mark,) = known.marks(SIGINT)
    assert mark.kwargs["strict"] and mark.kwargs["raises"] is known.KnownBugFailure
    assert "11.5" in mark.kwargs["reason"] and known.marks(CLEAN) == []
