"""`compile_step` over tensor parallelism and FSDP's gather at use, alone and under activation
checkpointing and offload, on 2 real ranks (gloo).

One launch of tests/parallel/compile_worker.py; the tests read its results. Each case trains the
same model for 4 steps eagerly and compiled (`backend="aot_eager"`, counted), and the parameters
come out bit-identical, except where the compiled step adds differently (q, k and v reading
one input: each takes its own `copy_to_tp` in the graph, so their input gradients are
all-reduced apart and then summed).

- tensor parallelism: one graph, compiled once and run every step, no graph break (the
  collectives are traced; before, dynamo failed with "Argument 'add' of Node 'scalar_tensor'
  does not belong to this Graph", then recompiled on every step);
- gather at use under checkpointing (and offload): the checkpointed blocks run torch's
  checkpoint eagerly, with the forward's tensors and gathers for the recomputation (before:
  "native_layer_norm got mixed torch.Tensor and DTensor").
"""

import pytest
from parallel_launching import launched_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launched_results(tmp_path_factory, "compile_worker.py", timeout=900)


@pytest.mark.parametrize(
    "case",
    ["tp", "tp_colwise_gather", "tp_under_checkpointing"],
)
def test_compiled_tensor_parallel_step_is_one_graph_equal_to_the_eager_step(results, case):
    result = results[case]
    assert result["identical"], result
    assert result["graphs"] == 1, result  # compiled once: no recompilation per step
    assert result["calls"] == result["steps"], result  # and its graph is what ran
    assert result["graph_breaks"] == 0, result


def test_compiled_tensor_parallel_step_with_offload_equals_the_eager_step(results):
    result = results["tp_under_checkpointing_and_offload"]
    assert result["identical"], result
    assert result["calls"] >= result["steps"], result


def test_compiled_layers_sharing_an_input_match_the_eager_step_to_rounding(results):
    result = results["tp_shared_input"]
    assert result["graphs"] == 1 and result["graph_breaks"] == 0, result
    assert result["max_error"] < 1e-6, result


def test_gathered_column_parallel_layer_trains_as_without_tensor_parallelism(results):
    assert results["colwise_gather_vs_without_tp"]["max_error"] < 1e-5, results


@pytest.mark.parametrize(
    "case",
    [
        "gather_at_use",
        "gather_under_offload",
        "gather_under_checkpointing",
        "gather_under_checkpointing_and_offload",
    ],
)
def test_compiled_step_gathering_at_use_equals_the_eager_step(results, case):
    result = results[case]
    assert result["identical"], result
    assert result["calls"] > 0, result  # some of it did run compiled
