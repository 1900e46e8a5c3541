"""The bugs the matrix is known to hit today, each with the issue point that fixes it.

A scenario that one of them applies to is marked `xfail(strict=True, raises=KnownBugFailure)`:
the test raises `KnownBugFailure` only when every problem it found is explained by a listed bug's
signature, so a scenario that fails for some other reason still fails the suite, and one that
passes (the fix landed) shows as XPASS, which strict mode turns into a failure that says to
remove it from this table.

Example:
    >>> [bug.point for bug in applicable(Scenario.from_row(row))]
    ['11.1', '11.2']
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
from scenario_axes import Scenario


class KnownBugFailure(AssertionError):
    """A scenario failed, and only in the ways its known bugs explain."""


@dataclasses.dataclass(frozen=True)
class KnownBug:
    point: str  # the issue point ("11.1")
    fixed_by: str  # where the fix is being made
    symptom: str
    applies: Callable[[Scenario], bool]
    signature: str  # a regex every problem it causes matches
    # False for a bug that only some runs of a scenario hit (where the ranks agree to stop is
    # timing-dependent): a pass is then an XPASS, not a failure
    strict: bool = True

    def explains(self, problem: str) -> bool:
        return re.search(self.signature, problem) is not None


# Issue 11's points 1-5 (auto-resume with algorithm state, skips inside fit, epoch warm-ups of
# decoupled optimizers, SIGTERM and Ctrl-C under the launcher) are fixed: their entries went
# when the fixes landed. A newly found bug is listed here with its issue point until fixed.
# 29.2 (a stop on a step the local tier saved left no root checkpoint of it) was fixed in the
# loop's `_checkpoint`.
KNOWN: list[KnownBug] = []


def applicable(scenario: Scenario) -> list[KnownBug]:
    return [bug for bug in KNOWN if bug.applies(scenario)]


def reason(scenario: Scenario) -> str:
    return "; ".join(f"{b.point} ({b.fixed_by}): {b.symptom}" for b in applicable(scenario))


def marks(scenario: Scenario) -> list:
    """The pytest marks for a scenario's test: a strict xfail naming its known bugs."""
    if not applicable(scenario):
        return []
    strict = all(bug.strict for bug in applicable(scenario))
    return [pytest.mark.xfail(strict=strict, raises=KnownBugFailure, reason=reason(scenario))]


def unexplained(scenario: Scenario, problems: list[str]) -> list[str]:
    """The problems none of the scenario's known bugs explains."""
    bugs = applicable(scenario)
    return [p for p in problems if not any(b.explains(p) for b in bugs)]


def raise_for(scenario: Scenario, problems: list[str]) -> None:
    """Pass silently, raise `KnownBugFailure` (all explained) or `AssertionError` (not)."""
    if not problems:
        return
    text = "\n  - ".join(problems)
    if unexplained(scenario, problems) or not applicable(scenario):
        raise AssertionError(f"scenario {scenario.id} failed:\n  - {text}")
    raise KnownBugFailure(
        f"scenario {scenario.id} failed as known ({reason(scenario)}):\n  - {text}"
    )
