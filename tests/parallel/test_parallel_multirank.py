"""Real multi-process runs on gloo: N ranks must match one process on the same global batch.

Each world size is one launch of tests/parallel/parallel_worker.py through `python -m functrain.launch`
(so the launcher is exercised too); the tests below read its results. When pytest itself runs
as a rank (`python -m functrain.launch -n 2 -m pytest tests/parallel`), the scenarios for that world
size run in-process instead and the others skip.
"""

import json
import math
import os
import sys

import pytest
from parallel_launching import HERE, launch, launched_world
from parallel_worker import STEPS

TOLERANCE = 1e-5
_results: dict[int, dict] = {}

pytestmark = pytest.mark.slow


def results(world: int, tmp_path_factory) -> dict:
    if world in _results:
        return _results[world]
    outer = launched_world()
    if outer is not None:
        if outer != world:
            pytest.skip(f"needs {world} ranks; this run has {outer}")
        sys.path.insert(0, HERE)
        import parallel_worker

        _results[world] = parallel_worker.run_all(world)
        return _results[world]
    out = tmp_path_factory.mktemp(f"world{world}") / "results.json"
    proc = launch(
        world, [os.path.join(HERE, "parallel_worker.py"), "--out", str(out), "--world", str(world)]
    )
    if proc.returncode != 0:
        pytest.fail(f"{world}-rank run failed:\n{proc.stderr[-6000:]}")
    _results[world] = json.loads(out.read_text())
    return _results[world]


def close(value, tolerance=TOLERANCE):
    """`value` within tolerance; None (a rank other than 0, which has no reference) passes."""
    return value is None or value <= tolerance


PLANS = [
    (2, "ddp"),
    (2, "fsdp"),
    (2, "ddp_fused"),
    (2, "fsdp_fused"),
    (2, "fsdp_reshard"),
    (2, "fsdp_reshard_fused"),
    (2, "fsdp_reshard_microbatch"),
    (2, "tied_fsdp_reshard"),
    (2, "tied_ddp"),
    (2, "tied_fsdp"),
    (2, "tp"),
    (4, "ddp"),
    (4, "fsdp"),
    (4, "fsdp_fused"),
    (4, "fsdp_reshard"),
    (4, "tp_fsdp_reshard"),
    (4, "hsdp"),
    (4, "tp_fsdp"),
]


@pytest.mark.parametrize("world, scenario", PLANS)
def test_n_ranks_match_one_process(world, scenario, tmp_path_factory):
    result = results(world, tmp_path_factory)[scenario]
    assert result["names_match"]
    assert close(result["max_error"]), (
        f"{scenario} on {world} ranks: max error {result['max_error']}"
    )
    assert close(result["loss_error"]), f"loss metric differs by {result['loss_error']}"
    assert result["loss_last"] < result["loss_first"]  # it trained
    if "reshard" in scenario:  # gathered per module at use, and again for the backward pass
        assert result["comm"]["calls"]["all_gather"] > STEPS * 2
    if scenario.endswith("_fused"):  # the fused kernel ran on the local pieces, every step
        assert result["fused_calls"] == STEPS


def test_tensor_parallel_block_costs_four_all_reduces(tmp_path_factory):
    """Per block and step: one shared f for q/k/v, one for fc1 (backward), two g's (forward)."""
    assert results(2, tmp_path_factory)["tp"]["comm"]["calls"] == {"all_reduce": 4 * 20}


def test_placements_of_the_2d_plans(tmp_path_factory):
    placements = results(4, tmp_path_factory)["tp_fsdp"]["placements"]
    assert placements["blocks.0.attn.q.weight"] == ["R", "S(1)", "S(0)"]  # TP rows, FSDP cols
    assert placements["blocks.0.attn.o_proj.weight"] == ["R", "S(0)", "S(1)"]
    assert placements["blocks.0.attn.q.bias"] == ["R", "R", "S(0)"]
    assert placements["tok.weight"] == ["R", "S(0)", "R"]  # tied head: FSDP only
    hsdp = results(4, tmp_path_factory)["hsdp"]["placements"]
    assert hsdp["fc1.weight"] == ["R", "S(0)", "R"]


def _padded_bytes(result_world: int, shapes: dict) -> int:
    total = 0
    for shape in shapes.values():
        rows = -(-shape[0] // result_world) * result_world
        total += rows * math.prod(shape[1:]) * 4
    return total


MLP_SHAPES = {"fc1.weight": (13, 7), "fc1.bias": (13,), "fc2.weight": (5, 13), "fc2.bias": (5,)}


@pytest.mark.parametrize("world", [2, 4])
def test_bytes_communicated_match_the_plan(world, tmp_path_factory):
    """Counted traffic per step equals the theoretical volume of each plan exactly."""
    res = results(world, tmp_path_factory)
    steps, n = 20, world
    ddp = res["ddp"]["comm"]
    params = res["ddp"]["param_bytes"]
    assert ddp["calls"] == {"all_reduce": 2 * steps}  # one gradient bucket + the loss, per step
    assert ddp["payload_bytes"]["all_reduce"] == steps * (params + 4)
    fsdp = res["fsdp"]["comm"]
    padded = _padded_bytes(n, MLP_SHAPES)  # uneven shards travel padded
    assert fsdp["calls"] == {"all_gather": steps, "reduce_scatter": steps, "all_reduce": steps}
    assert fsdp["payload_bytes"]["all_gather"] == steps * padded
    assert fsdp["payload_bytes"]["reduce_scatter"] == steps * padded
    expected = steps * (2 * padded * (n - 1) / n + 2 * 4 * (n - 1) / n)
    assert fsdp["sent_bytes"] == pytest.approx(expected)


@pytest.mark.parametrize("world", [2, 4])
def test_global_norm_is_the_unsharded_norm(world, tmp_path_factory):
    res = results(world, tmp_path_factory)["global_norm"]
    for plan, norms in res["norms"].items():
        for who, value in norms.items():
            assert value == pytest.approx(res["expected"], rel=1e-6), (plan, who)


def test_microbatches_reduce_once(tmp_path_factory):
    res = results(2, tmp_path_factory)["microbatch"]
    assert res["ddp"]["calls"] == {"all_reduce": 1}
    assert res["fsdp"]["calls"] == {"all_gather": 1, "reduce_scatter": 1}
    assert res["ddp"]["max_error"] < 1e-6 and res["fsdp"]["max_error"] < 1e-6


def test_mixed_precision_gathers_bf16_reduces_fp32(tmp_path_factory):
    res = results(2, tmp_path_factory)["mixed_precision"]
    assert res["finite"] and res["param_dtypes"] == ["torch.float32"]
    payload = res["comm"]["payload_bytes"]
    assert payload["all_gather"] * 2 == payload["reduce_scatter"]
    assert close(res["max_error"], 5e-3)  # bf16 compute vs the fp32 reference


def test_meta_init_is_sharded_and_mesh_independent(tmp_path_factory):
    res = results(2, tmp_path_factory)["meta_init"]
    assert res["max_error"] == 0.0
    assert res["local_numel"] < res["total_numel"]
    assert res["model_params_are_state"]


def test_call_model_under_fsdp(tmp_path_factory):
    assert results(2, tmp_path_factory)["eval"]["max_error"] < 1e-6


def test_reshard_after_forward_holds_one_module_at_a_time(tmp_path_factory):
    result = results(2, tmp_path_factory)["reshard_memory"]
    # forward: each of the 6 modules gathers when it runs, and the previous one's whole
    # parameters are gone by then; backward: at most one module gathered again at a time
    assert len(result["forward"]) == 6 and max(result["forward"]) == 0
    assert 1 in result["backward"] and max(result["backward"]) <= 1
    assert result["eval_error"] <= TOLERANCE  # call_model gathers at use as well


def test_reshard_names_the_cause_of_a_parameter_used_outside_its_module(tmp_path_factory):
    error = results(2, tmp_path_factory)["reshard_outside_use"]["error"]
    assert error is not None and "reshard_after_forward" in error and "plan='fsdp'" in error


def test_two_models_with_the_same_names_and_different_plans_train_side_by_side(tmp_path_factory):
    """fsdp with bf16 compute and ddp in fp32, one step each in turn: each equals its own
    single-process run (computed by hand), so neither saw the other's policy."""
    res = results(2, tmp_path_factory)["side_by_side"]
    assert res["plans"] == ["fsdp", "ddp"]
    assert res["a_param_dtype"] == "torch.bfloat16" and res["b_param_dtype"] == "None"
    assert close(res["a_error"]) and close(res["b_error"]), res
    # the references differ by far more than the tolerance: a leaked policy would show
    assert res["bf16_vs_fp32"] is None or res["bf16_vs_fp32"] > 10 * TOLERANCE


def test_optimizer_monitor_reports_whole_tensor_norms_under_fsdp(tmp_path_factory):
    """OptimizerMonitor through fit on 2 fsdp ranks logs the norms of one process."""
    res = results(2, tmp_path_factory)["optimizer_monitor"]
    assert {"l2_norm/param/fc1", "l2_norm/grad/fc1", "l2_norm/param/global"} <= set(res["keys"])
    assert res["max_rel_error"] <= TOLERANCE, res


def test_nan_monitor_trips_on_every_rank_together(tmp_path_factory):
    """A metric NaN on rank 1 only: rank 0's monitor raises too, naming the same step."""
    res = results(2, tmp_path_factory)["nan_monitor"]
    assert res["raised"], res["message"]
    assert "at step 2" in res["message"] and "another rank" in res["message"]


@pytest.mark.parametrize("scenario", ["bn_ddp", "bn_fsdp"])
def test_batchnorm_statistics_are_rank0s_on_every_rank_after_every_step(scenario, tmp_path_factory):
    """Issue 30.1: each rank's batch moves its BatchNorm statistics, yet after every step every
    rank holds rank 0's, so the checkpoint's one copy is every rank's and evaluation agrees."""
    res = results(2, tmp_path_factory)[scenario]
    assert res["moved"] > 0  # the running statistics did move
    assert res["local_spread"] > 0  # each rank's own forward moved them differently
    assert res["buffer_spread"] == 0.0
    assert res["eval_spread"] == 0.0


@pytest.mark.parametrize("scenario", ["sync_bn_ddp", "sync_bn_fsdp"])
def test_sync_batchnorm_makes_two_ranks_equal_one_process(scenario, tmp_path_factory):
    """Issue 30.1: with `sync_batchnorm`, 2 ranks train exactly the one-process model on the
    global batch (parameters and running statistics within 1e-5)."""
    res = results(2, tmp_path_factory)[scenario]
    assert "bn.running_var" in res["names"]
    assert close(res["max_error"]), res["max_error"]
