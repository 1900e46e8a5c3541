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
    ("functrain/optim/base.py", 155, "core/AddNot"): (
        "`_add`'s length check cannot fail: the dict path builds both lists from the same names, "
        "the pytree path only after checking that both trees have one structure (so the message "
        "with or without names is never built)"
    ),
    ("functrain/optim/base.py", 190, "core/ReplaceComparisonOperator_Eq_Is"): (
        "torch dtypes are singletons: `x.dtype is torch.float64` is `x.dtype == torch.float64`"
    ),
}
