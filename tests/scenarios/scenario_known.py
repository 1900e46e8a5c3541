"""The bugs the matrix is known to hit today, each with the issue point that fixes it.

A scenario that one of them applies to is marked `xfail(strict=True, raises=KnownBugFailure)`:
the test raises `KnownBugFailure` only when every problem it found is explained by a listed bug's
signature, so a scenario that fails for some other reason still fails the suite, and one that
passes (the fix landed) shows as XPASS, which strict mode turns into a failure for the lead to
see and remove from this table.

Example:
    >>> [bug.point for bug in applicable(Scenario.from_row(row))]
    ['11.1', '11.2']
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
from scenario_axes import MULTI_RANK, Scenario


class KnownBugFailure(AssertionError):
    """A scenario failed, and only in the ways its known bugs explain."""


@dataclasses.dataclass(frozen=True)
class KnownBug:
    point: str  # the issue point ("11.1")
    room: str  # the branch fixing it
    symptom: str
    applies: Callable[[Scenario], bool]
    signature: str  # a regex every problem it causes matches

    def explains(self, problem: str) -> bool:
        return re.search(self.signature, problem) is not None


KNOWN: list[KnownBug] = [
    KnownBug(
        "11.1",
        "loop",
        "auto-resume with a stateful algorithm (EMA, SWA) or fp16 crashes: fit builds the "
        "restore target before the step adds its algo_state",
        lambda s: (
            s.interruption != "none"
            and (s.algorithm in ("recipe", "swa") or s.precision == "amp_fp16")
        ),
        r"CheckpointMismatchError: .*unknown to `like`: 'algo_state\.",
    ),
    KnownBug(
        "11.2",
        "step",
        "an fp16 overflow skip inside fit (donated) leaves NaN parameters instead of the old ones",
        lambda s: s.precision == "amp_fp16",
        r"skipped as non-finite but changed the parameters|final state has non-finite leaves",
    ),
    KnownBug(
        "11.3",
        "optim",
        "decoupled_sgdw with a warm-up in 'ep' or 'dur' units crashes in functrain.init",
        lambda s: s.optimizer == "decoupled" and s.schedule in ("ep", "dur"),
        r"cannot resolve a time in '(ep|dur)' units",
    ),
    KnownBug(
        "11.4",
        "loop/teardown",
        "SIGTERM under the launcher ends in torchrun's SignalException traceback (and can "
        "deadlock: ranks stop at different steps)",
        lambda s: s.interruption == "sigterm" and s.layout in MULTI_RANK,
        r"after SIGTERM (the launcher printed a traceback|the launch hung|the run stopped after)",
    ),
    KnownBug(
        "11.5",
        "loop",
        "Ctrl-C (SIGINT) raises KeyboardInterrupt mid-step and writes no checkpoint at the stop",
        lambda s: s.interruption == "sigint",
        r"after SIGINT \(Ctrl-C\)",
    ),
]


def applicable(scenario: Scenario) -> list[KnownBug]:
    return [bug for bug in KNOWN if bug.applies(scenario)]


def reason(scenario: Scenario) -> str:
    return "; ".join(f"{b.point} ({b.room}): {b.symptom}" for b in applicable(scenario))


def marks(scenario: Scenario) -> list:
    """The pytest marks for a scenario's test: a strict xfail naming its known bugs."""
    if not applicable(scenario):
        return []
    return [pytest.mark.xfail(strict=True, raises=KnownBugFailure, reason=reason(scenario))]


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
