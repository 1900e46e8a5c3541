"""Surviving mutants judged equivalent: no test can tell them from the original code.

Keyed by (module, line, cosmic-ray operator) of the mutant (the lines of the module as it is on
this branch; a change to the module that moves a line makes its entry stale, and the mutant is
then reported as a survivor again, to be judged anew). Each value says why.
"""

EQUIVALENT: dict[tuple[str, int, str], str] = {
    ("functrain/schedules/decay.py", 258, "core/AddNot"): (
        "the first correction loop of warm restarts (step back while the cycle's start is past "
        "`now`) never runs: the log estimate never overshoots by more than the 1e-12 slack that "
        "the second loop's `_reached` absorbs (300,000 random t_0, t_mult, cycle and near-boundary "
        "times: the index is the same with and without it); it is kept as a guard"
    ),
}
