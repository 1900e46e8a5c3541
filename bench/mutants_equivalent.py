"""Surviving mutants judged equivalent: no test can tell them from the original code.

Keyed by (module, line, cosmic-ray operator) of the mutant (the lines of the module as it is on
this branch; a change to the module that moves a line makes its entry stale, and the mutant is
then reported as a survivor again, to be judged anew). Each value says why.
"""

EQUIVALENT: dict[tuple[str, int, str], str] = {
    **{
        ("functrain/time.py", line, "core/ReplaceComparisonOperator_Is_Eq"): (
            "`unit` is a TimeUnit (from `_as_unit`) and enum members are singletons: `==` is `is`"
        )
        for line in (251, 285)
    },
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
    ("functrain/step.py", 278, "core/ReplaceAndWithOr"): (
        "`guarded and donate or state.buffers` also clones the buffers of unguarded or "
        "non-donating steps; the clone is read only when a guarded step skips, and a "
        "non-donating step never writes its input's buffers (test_pure_step_leaves_input_state_"
        "unchanged), so the copy back writes the values already there: a cost, not a behaviour"
    ),
    ("functrain/step.py", 354, "core/ReplaceComparisonOperator_Eq_Is"): (
        "torch dtypes are singletons: `norms[0].dtype is torch.float64` is `== torch.float64`"
    ),
    ("functrain/schedules/base.py", 176, "core/ReplaceComparisonOperator_Is_Eq"): (
        "`value.unit` is a TimeUnit (Time coerces it) and enum members are singletons: `==` is `is`"
    ),
    ("functrain/optim/lion.py", 59, "core/ReplaceTrueWithFalse"): (
        "the sign is taken in place on the lerp's result, a fresh list of temporaries "
        '(`fe("lerp", ...)` without inplace returns new tensors): out of place gives the same '
        "values in one more allocation"
    ),
    ("functrain/step_grads.py", 254, "core/ReplaceComparisonOperator_Is_Eq"): (
        "torch dtypes are singletons: `total_loss.dtype == torch.float32` is `is torch.float32`"
    ),
    ("functrain/step_plan.py", 101, "core/NumberReplacer"): (
        "`_plain` checks that all tensors share one dtype and device; comparing each with the "
        "last instead of the first gives the same answer (equal to one member iff all equal)"
    ),
    ("functrain/optim/sgd.py", 64, "core/ReplaceComparisonOperator_Eq_LtE"): (
        "`count <= 0` for `count == 0`: the count starts at 0 (init) and each update adds one; "
        "no transform produces a negative count (only a hand-made, invalid state could hold one)"
    ),
    ("functrain/optim/buffers.py", 57, "core/NumberReplacer"): (
        "`_UNREFERENCED` is the reference counts of a lone tensor in a one-element list: "
        "`torch.empty(0)` has the same counts as `torch.empty(1)` (counts do not depend on the "
        "size), and index -1 of a one-element list is index 0"
    ),
    ("functrain/optim/buffers.py", 62, "core/ReplaceComparisonOperator_Is_Eq"): (
        "`type(buffer) == torch.Tensor`: classes compare by identity (torch's tensor metaclass "
        "defines no `__eq__`), so `==` is `is`"
    ),
    ("functrain/step_grads.py", 253, "core/NumberReplacer"): (
        "`outs[-1]` for `outs[0]` inside `if len(outs) == 1`: the same element"
    ),
    ("functrain/step_grads.py", 125, "core/ExceptionReplacer"): (
        "`_slots` catches the AttributeError of `get_submodule` for a name no submodule has, to "
        "fall back to functional_call, which walks the same attribute path and raises the same "
        "AttributeError ('Linear has no attribute `ghost`'): not catching it changes only the "
        "line that raises"
    ),
    ("functrain/optim/_foreach.py", 154, "core/ReplaceComparisonOperator_NotEq_IsNot"): (
        "`params.keys() is not grads.keys()` is always true, so the missing names are always "
        "listed; when the key sets are equal that list is empty and nothing is raised, as when "
        "the `!=` shortcut skips it"
    ),
    # ---- functional/, fourth round: augmentation and data (room fnA) ----
    #
    #
    # ---- functional/, fourth round: surgery and layers (room fnB) ----
    #
    #
    # ---- functional/, fourth round: sequence models and training (room fnC) ----
    #
    #
    ("functrain/functional/gradient_clipping.py", 82, "core/ReplaceFalseWithTrue"): (
        "`fsdp_enabled=True` as the default: the argument exists only for Composer's signature "
        "and is deleted unread on the first line (`del fsdp_enabled`), so no value changes a result"
    ),
    ("functrain/functional/layer_freezing.py", 52, "core/NumberReplacer"): (
        "`current_duration=-1.0` as `freeze_layers`' default instead of 0.0: `freeze_start` is "
        "checked to lie in [0, 1), and every elapsed time at or before it gives the fraction 0, "
        "so both defaults return (0, 0.0) for every valid freeze_start and freeze_level"
    ),
}


# Survivors that are not equivalent and not (yet) killed: why, so the next round can pick them up.
# (Every entry of earlier rounds whose mutant a test now kills was removed; see MUTANTS.md.)
NOT_KILLED: dict[tuple[str, int, str], str] = {
    ("functrain/functional/sam.py", 38, "core/NumberReplacer"): (
        "`names[0]` -> `names[-1]`: the device the scale is moved to, taken from the first or the "
        "last gradient. They differ only for gradients on several devices, which needs a second "
        "real device (CPU-only here: 'meta' tensors cannot be normed, so `global_grad_norm` "
        "fails before this line). On a GPU machine `{cuda grad, cpu grad}` should tell them apart "
        "(a CUDA 0-d scale cannot multiply a CPU tensor; a CPU 0-d scale can multiply a CUDA "
        "one). That case is a gap of its own: `global_norm` accepts mixed devices, but the scale "
        "then serves only gradients the first one's device can multiply (Composer's SAMOptimizer "
        "moves it to each parameter, `scale.to(p)`, though its `_grad_norm` stacks norms from "
        "all devices and fails first). Left unchanged: not verifiable without a GPU"
    ),
}
