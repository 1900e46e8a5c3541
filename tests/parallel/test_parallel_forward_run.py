"""The forward run's installers in pairs that interact, on 2 real ranks (gloo).

One launch of tests/parallel/forward_run_worker.py; the tests read its results. Each pair trains
the same GPT (dropout on) on the same 2 ranks with and without the algorithm installed over the
layout's installer, and the parameters come out bit-identical:

- tensor parallelism under activation checkpointing: the recomputation, in the backward pass,
  runs the tensor-parallel forwards again (before the forward run, it ran the plain forward on
  the shards: torch's CheckpointError, recomputed shapes differ);
- FSDP's gather at use under activation offload: gathered parameters are still gathered at use
  (the same count), and their views stay handles rather than host copies.
"""

import pytest
from parallel_launching import launched_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launched_results(tmp_path_factory, "forward_run_worker.py")


@pytest.mark.parametrize("pair", ["tp_under_checkpointing", "tp_under_checkpointing_and_offload"])
def test_tensor_parallel_under_checkpointing_equals_without(results, pair):
    assert results[pair]["identical"], results[pair]


@pytest.mark.parametrize(
    "pair",
    [
        "gather_under_offload",
        "gather_under_offload_of_blocks",
        "gather_under_checkpointing_and_offload",
    ],
)
def test_fsdp_gather_at_use_under_offload_equals_without(results, pair):
    assert results[pair]["identical"], results[pair]
    plain, installed = results[pair]["gathers_at_use"]
    assert plain > 0  # the pair did meet: buckets were gathered at use
    if "checkpointing" in pair:  # recomputed blocks gather again
        assert installed > plain
    else:
        assert installed == plain
