"""Which scenarios run: the pairwise design CI runs, and the bigger ones `python -m bench
scenarios` runs.

The CI design is a strength-2 covering array over the axes with every interruption but `none`:
each interrupted scenario runs next to its uninterrupted reference anyway (that is what it is
compared with), so the references cover every pair that `interruption=none` makes.

Example:
    >>> rows = ci_scenarios()
    >>> missing(executed_rows(rows), AXES, 2, FORBIDDEN)
    []
"""

from __future__ import annotations

import functools

from scenario_axes import AXES, FORBIDDEN, Scenario
from scenario_covering import covering_array, full_product

DESIGN_SEEDS = range(8)  # the smallest of these greedy designs is used


def _interrupted_axes() -> dict[str, list[str]]:
    axes = dict(AXES)
    axes["interruption"] = [v for v in AXES["interruption"] if v != "none"]
    return axes


@functools.cache
def _design(strength: int) -> tuple[Scenario, ...]:
    axes = _interrupted_axes()
    best = min(
        (covering_array(axes, strength, forbidden=FORBIDDEN, seed=seed) for seed in DESIGN_SEEDS),
        key=len,
    )
    return tuple(Scenario.from_row(row) for row in best)


def ci_scenarios() -> list[Scenario]:
    """The pairwise design (50 scenarios: at least the 8 x 6 pairs of algorithm and interruption;
    44 before the `batchnorm` algorithm and the `recovery` axis)."""
    return list(_design(2))


def scenarios_of_strength(strength: int) -> list[Scenario]:
    """A covering design of `strength` (3: every triple of axis values meets)."""
    return list(_design(strength))


def all_scenarios() -> list[Scenario]:
    """The full cross product minus the forbidden pairs, interrupted runs only (the references
    with `interruption=none` run beside them)."""
    return [Scenario.from_row(r) for r in full_product(_interrupted_axes(), FORBIDDEN)]


def executed_rows(scenarios) -> list[dict[str, str]]:
    """The rows that actually run: every scenario and the reference it is compared with."""
    rows = [s.row for s in scenarios]
    return rows + [s.reference().row for s in scenarios]
