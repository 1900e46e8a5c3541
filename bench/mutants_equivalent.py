"""Surviving mutants judged equivalent: no test can tell them from the original code.

Keyed by (module, line, cosmic-ray operator) of the mutant (the lines of the module as it is on
this branch; a change to the module that moves a line makes its entry stale, and the mutant is
then reported as a survivor again, to be judged anew). Each value says why.
"""

EQUIVALENT: dict[tuple[str, int, str], str] = {}
