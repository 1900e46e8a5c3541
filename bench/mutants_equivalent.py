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
    ("functrain/step.py", 267, "core/ReplaceAndWithOr"): (
        "`guarded and donate or state.buffers` also clones the buffers of unguarded or "
        "non-donating steps; the clone is read only when a guarded step skips, and a "
        "non-donating step never writes its input's buffers (test_pure_step_leaves_input_state_"
        "unchanged), so the copy back writes the values already there: a cost, not a behaviour"
    ),
    ("functrain/step.py", 339, "core/ReplaceComparisonOperator_Eq_Is"): (
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
    ("functrain/step_grads.py", 218, "core/ReplaceComparisonOperator_Is_Eq"): (
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
}


# Survivors that are not equivalent and not (yet) killed: why, so the next round can pick them up.
MULTI_RANK = (
    "a path taken only with >= 2 ranks (a world size, rank 0's broadcast, a sharded mesh "
    "dimension); the module's per-mutant selection runs in one process. "
)
FORK_SERVER = (
    "killed by tests/optim/test_optim_distributed.py when planted by hand (a direct pytest run, "
    "~40-130 s) but reported surviving under the fork server: its spawned ranks apparently do "
    "not see the mutant (unexplained; see MUTANTS.md), so multi-rank verdicts of the fork "
    "server are not trusted"
)
NOT_KILLED: dict[tuple[str, int, str], str] = {
    **{
        (
            "functrain/time.py",
            line,
            op,
        ): "drawn by the last (deterministic) sample, no test added yet"
        for line, op in [
            (68, "core/ReplaceComparisonOperator_Lt_NotEq"),
            (170, "core/ReplaceOrWithAnd"),
            (198, "core/ReplaceTrueWithFalse"),
            (217, "core/NumberReplacer"),
        ]
    },
    ("functrain/optim/base.py", 204, "core/ReplaceComparisonOperator_Gt_Eq"): FORK_SERVER,
    ("functrain/optim/base.py", 213, "core/ReplaceBinaryOperator_Add_RShift"): FORK_SERVER,
    ("functrain/optim/base.py", 207, "core/NumberReplacer"): (
        "`is_dtensor(leaves[-1])`: differs only for a tree mixing DTensor and plain leaves, "
        "which no test builds"
    ),
    **{
        ("functrain/parallel/plans.py", line, op): MULTI_RANK + "Not run per mutant: "
        "tests/parallel/test_parallel_multirank.py takes minutes here."
        for line, op in [
            (125, "core/ReplaceAndWithOr"),
            (130, "core/NumberReplacer"),
            (165, "core/ReplaceComparisonOperator_LtE_NotEq"),
            (168, "core/AddNot"),
            (237, "core/AddNot"),
            (252, "core/ReplaceComparisonOperator_Gt_LtE"),
            (379, "core/ReplaceUnaryOperator_Delete_Not"),
            (384, "core/NumberReplacer"),
        ]
    },
    ("functrain/parallel/plans.py", 274, "core/ReplaceOrWithAnd"): (
        "the error message for the root module ('<root>'): no test reads that message"
    ),
    ("functrain/parallel/compute.py", 192, "core/NumberReplacer"): (
        "the bucket's device from its last parameter instead of its first: all parameters are on "
        "the CPU here, so only a mixed-device bucket (a GPU machine) could tell"
    ),
    ("functrain/parallel/compute.py", 280, "core/AddNot"): (
        "mean_over_data_parallel(layout=None) is not called by test_parallel_compute.py"
    ),
    ("functrain/parallel/compute.py", 286, "core/ReplaceAndWithOr"): (
        "mean_over_data_parallel on a tree with non-tensor leaves is not tested"
    ),
    ("functrain/step.py", 219, "core/ReplaceOrWithAnd"): (
        "`_can_fuse` picks the fused or the per-transform update; both give the same numbers, so "
        "a wrong choice shows only in speed (a test would have to observe the path taken)"
    ),
    ("functrain/step.py", 226, "core/ReplaceAndWithOr"): (
        "`_can_fuse` with DTensor leaves (fused refused): multi-rank tests only"
    ),
    ("functrain/step.py", 227, "core/ReplaceFalseWithTrue"): (
        "`_can_fuse` with DTensor leaves (fused refused): multi-rank tests only"
    ),
    ("functrain/step.py", 315, "core/ReplaceComparisonOperator_LtE_NotEq"): (
        "the microbatch-halving fallback at size 1 (`current <= 1`): not reached by test_step.py"
    ),
    ("functrain/step.py", 335, "core/ReplaceOrWithAnd"): (
        "`_grad_norm` of an empty or non-plain gradient tree: not tested"
    ),
    ("functrain/functional/mixup.py", 50, "core/NumberReplacer"): (
        "mixup_batch's default alpha (0.2): no test samples with the default"
    ),
    ("functrain/checkpoint/reader.py", 133, "core/ReplaceComparisonOperator_IsNot_Is"): (
        "`describe` of a commit without 'files' (older format): not tested"
    ),
    ("functrain/checkpoint/reader.py", 172, "core/NumberReplacer"): (
        "a commit at step 0 refused: needs a checkpoint saved at step 0 (the reader checks the "
        "step against tree.json and the state's step leaf, so editing COMMIT.json is not enough)"
    ),
    **{
        ("functrain/data.py", line, op): "not analysed in this round (data.py was measured last)"
        for line, op in [
            (211, "core/NumberReplacer"),
            (226, "core/RemoveDecorator"),
            (339, "core/ReplaceAndWithOr"),
            (356, "core/ReplaceComparisonOperator_Is_IsNot"),
            (435, "core/NumberReplacer"),
            (496, "core/ReplaceTrueWithFalse"),
        ]
    },
}
