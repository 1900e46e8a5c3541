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
    ("functrain/checkpoint/reader.py", 375, "core/ReplaceBinaryOperator_Mul_Div"): (
        "`*` -> `/` in `_read_all`'s signature: `inplace` becomes positional-or-keyword instead "
        "of keyword-only; every caller passes it by keyword, so no call changes"
    ),
    ("functrain/checkpoint/reader.py", 431, "core/ReplaceTrueWithFalse"): (
        "`assume_metadata=False` makes tensorstore read each array's zarr.json instead of "
        "trusting the spec the reader built from it after validating; the same bytes are read "
        "(one more small read per array): a cost, not a behaviour"
    ),
    ("functrain/optim/base.py", 204, "core/NumberReplacer"): (
        "`mesh.size(i) > 0` instead of `> 1` (the draw after the fix of the sampling; the "
        "first run drew `> 2`): it also all-reduces over mesh dimensions of size 1, a sum over "
        "one rank, which returns the value unchanged"
    ),
}
