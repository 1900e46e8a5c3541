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
        '(`foreach_op("lerp", ...)` without inplace returns new tensors): out of place gives the same '
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
    ("functrain/optim/fused.py", 162, "core/NumberReplacer"): (
        "`new[-1]` for `new[0]`: the rebuild of a single leaf is given the one-element list of "
        "that leaf's new state, whose last element is its first"
    ),
    ("functrain/optim/fused.py", 421, "core/NumberReplacer"): (
        '`fused_plan` evaluates a schedule in epochs or "dur" at batch 0 of a stand-in horizon '
        "to see which kernels would run: at batch 0 the elapsed fraction is 0 whatever the "
        "horizon (1 or 2 batches), so every schedule gives its start value and the plan is the same"
    ),
    # ---- functional/, fourth round: augmentation and data ----
    #
    #
    ("functrain/data/batches.py", 37, "core/ReplaceComparisonOperator_Gt_NotEq"): (
        "`leaf.dim() != 0` for `leaf.dim() > 0`: a tensor's number of dimensions is never negative"
    ),
    ("functrain/functional/augmentation_chains.py", 47, "core/ReplaceComparisonOperator_Eq_LtE"): (
        "`rows.numel() <= 0` for `== 0`: a tensor's element count is never negative"
    ),
    **{
        ("functrain/functional/augmix.py", line, operator): (
            "the default `depth=-1` becomes -2, 0 or False (`~1`, `-0`, `not 1`): AugMix reads "
            "only `depth > 0`, and every depth <= 0 means 'draw 1, 2 or 3 per chain' (the "
            "documented Composer convention), so the draws and the output are the same"
        )
        for line in (37, 93)
        for operator in (
            "core/ReplaceUnaryOperator_USub_Invert",
            "core/NumberReplacer",
            "core/ReplaceUnaryOperator_USub_Not",
        )
    },
    ("functrain/functional/progressive_resizing.py", 65, "core/ReplaceComparisonOperator_LtE_Lt"): (
        "`size - cropped < 0` for `<= 0` in the private `_crop_offsets`: its one caller "
        "(`resize_batch`, crop mode) passes `cropped = int(scale_factor * size)` with "
        "0 < scale_factor < 1 (scale >= 1 returns early), and a float product `s * n` with s < 1 "
        "never rounds up to the integer n, so `size - cropped >= 1` and the branch never runs"
    ),
    ("functrain/functional/progressive_resizing.py", 65, "core/NumberReplacer"): (
        "`size - cropped <= -1` (the seed-1 draw) is `< 0`: equivalent for the reason above "
        "(`size - cropped >= 1`); the other draw, `<= 1`, skips the draw of a one-offset range and "
        "is killed by test_the_crop_corner_is_drawn_top_then_left_over_all_valid_offsets"
    ),
    ("functrain/functional/augmentation_primitives.py", 171, "core/NumberReplacer"): (
        "`(hist > -1).sum(1) <= 1` (the seed-1 draw) is never true and `... <= 0` never for a "
        "non-empty image, leaving `keep = step == 0`; the clause they drop (at most one non-empty "
        "level) implies `step == 0` anyway, since then `total == last_count`. The other draws "
        "(`hist > 1`, `<= 2`) are killed by the equalize known pairs"
    ),
    ("functrain/functional/augmentation_primitives.py", 257, "core/ReplaceAndWithOr"): (
        "`h > 2 or w > 2` also runs the smoothing when one side is <= 2, but then the interior "
        "slice `[1:-1, 1:-1]` is empty (as are the nine shifted views), so nothing is written "
        "and `smooth` stays the copy of the image, as when the branch is skipped"
    ),
    ("functrain/functional/selective_backprop.py", 76, "core/NumberReplacer"): (
        "`losses.shape[-1]` for `shape[0]` (the seed-1 draw): the line before refuses any `losses` "
        "that is not 1-D, and a 1-D shape's first and last entries are the same"
    ),
    ("functrain/functional/selective_backprop.py", 101, "core/ReplaceComparisonOperator_Is_GtE"): (
        "`p.kind >= p.VAR_KEYWORD` for `is`: parameter kinds are an IntEnum whose largest member "
        "is VAR_KEYWORD (4), so `>=` holds exactly for VAR_KEYWORD itself"
    ),
    (
        "functrain/functional/selective_backprop.py",
        108,
        "core/ReplaceComparisonOperator_Lt_NotEq",
    ): (
        "`scale_factor != 1` for `< 1`: a scale outside (0, 1] (NaN included) was refused at the "
        "top of the function, so the remaining values that differ from 1 are those below it"
    ),
    ("functrain/functional/selective_backprop.py", 101, "core/ReplaceComparisonOperator_Is_Eq"): (
        "`p.kind == p.VAR_KEYWORD` for `is`: parameter kinds are enum members, singletons, and "
        "an IntEnum member equals only itself among the kinds"
    ),
    ("functrain/functional/randaugment.py", 61, "core/ReplaceComparisonOperator_Eq_LtE"): (
        "`depth <= 0` for `depth == 0` (the seed-1 draw): a negative depth was refused a few "
        "lines above, so the two agree on every depth that reaches this line"
    ),
    ("functrain/functional/targets.py", 77, "core/NumberReplacer"): (
        "`num_classes + 2` for `+ 1` (the seed-1 draw): the scratch tensor gets a second extra "
        "class column that nothing is scattered into (indices go to 0..num_classes) and that "
        "`narrow(dim, 0, num_classes)` drops with the first: one more column, the same result"
    ),
    # ---- functional/, fourth round: surgery and layers ----
    ("functrain/functional/blurpool.py", 54, "core/ReplaceUnaryOperator_Delete_USub"): (
        "`filter.shape[2:]` for `filter.shape[-2:]`: the check just above refuses every filter "
        "that is not 4-D, and the last two sizes of a 4-D shape are its sizes from index 2"
    ),
    ("functrain/functional/blurpool.py", 55, "core/ReplaceComparisonOperator_Eq_LtE"): (
        "`kh % 2 <= 0` for `== 0`: a size is a nonnegative int, whose remainder by 2 is 0 or 1, "
        "never below 0"
    ),
    ("functrain/functional/blurpool.py", 57, "core/NumberReplacer"): (
        "`filter.shape[1] == 1` for `filter.shape[0] == 1`: the check above makes shape[1] 1 and "
        "shape[0] 1 or the input's channels, so the mutant also expands a (C, 1, kh, kw) filter "
        "to (C, 1, kh, kw), which changes nothing"
    ),
    ("functrain/functional/blurpool.py", 57, "core/ReplaceAndWithOr"): (
        "`or` for `and` in the depthwise expansion: the extra cases are a (1, 1, kh, kw) filter "
        "on one channel and a (C, 1, kh, kw) filter on C channels (the only shapes the check "
        "above lets through); expanding either to (C, 1, kh, kw) is a no-op"
    ),
    ("functrain/functional/blurpool.py", 70, "core/ReplaceFalseWithTrue"): (
        "blurmax_pool2d's `ceil_mode=True` default: the max runs at stride 1, where the output "
        "size (H + 2p - d(k - 1) - 1) / 1 + 1 is an integer, so ceil and floor agree and no "
        "extra window exists (the blur's size does not depend on it)"
    ),
    ("functrain/functional/blurpool.py", 195, "core/ReplaceComparisonOperator_Gt_NotEq"): (
        "`max(stride) != 1` for `> 1`: they differ only for a stride below 1, which nn.Conv2d "
        "stores but cannot run ('non-positive stride is not supported'), wrapped or not"
    ),
    ("functrain/functional/fused_layernorm.py", 46, "core/ReplaceComparisonOperator_IsNot_NotEq"): (
        "`type(module) != nn.LayerNorm` for `is not`: classes compare by identity (torch's "
        "module classes define no metaclass `__eq__`), so `!=` is `is not`"
    ),
    ("functrain/functional/ghost_batchnorm.py", 36, "core/NumberReplacer"): (
        "the momentum `factor` stays at its initial value only when the statistics are not "
        "tracked, and then F.batch_norm gets no running statistics (None) to update: the factor "
        "is never read"
    ),
    **{
        ("functrain/functional/ghost_batchnorm.py", 55, operator): (
            "`torch.cat` of the one-chunk list for `outs[0]` (`len(outs) == 0` / `< 1` never "
            "hold: chunk() of a non-empty batch gives at least one chunk): cat of a single "
            "tensor is a copy with the same values, dtype and shape, and passes the same gradients"
        )
        for operator in ("core/NumberReplacer", "core/ReplaceComparisonOperator_Eq_Lt")
    },
    ("functrain/functional/stochastic_depth.py", 130, "core/ReplaceComparisonOperator_Eq_GtE"): (
        "`drop_distribution >= 'uniform'` for `==`: the check above lets only 'uniform' and "
        "'linear' through, and 'linear' < 'uniform' as strings, so the branch is taken for "
        "'uniform' alone, as with `==`"
    ),
    **{
        (module, line, "core/ReplaceFalseWithTrue"): (
            "`full_matrices=True` in the SVD: only the leading `rank` columns of U and rows of "
            "Vh are used, and those are the same singular vectors with or without the full "
            "orthogonal completion (which is sliced away)"
        )
        for module, line in (
            ("functrain/functional/factorize.py", 46),
            ("functrain/functional/factorize_solvers.py", 114),
        )
    },
    **{
        ("functrain/functional/factorize_solvers.py", line, "core/NumberReplacer"): (
            "the `n_iters=3` default (Composer's) changed: n_iters is only validated (a positive "
            "int); the solution is the exact optimum in one pass, whatever its value"
        )
        for line in (68, 150)
    },
    ("functrain/functional/factorize_solvers.py", 126, "core/NumberReplacer"): (
        "of this line's numbers, `stride=1` (the one that survives; padding, dilation and groups "
        "are killed): `_unfolded` deletes `stride` unread, since every position is a sample of "
        "the regression whatever the layer's stride"
    ),
    ("functrain/functional/factorize.py", 164, "core/ReplaceComparisonOperator_Is_Eq"): (
        "`type(module) == nn.Linear` for `is`: classes compare by identity (no metaclass "
        "`__eq__`), so `==` is `is`"
    ),
    #
    # ---- functional/, fourth round: sequence models and training ----
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
# (Every entry of earlier rounds whose mutant a test now kills was removed; see docs/mutation_testing.md.)
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
