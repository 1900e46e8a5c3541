"""What only several ranks show, on 2 real ranks (gloo, spawned, one pair for all): shard_params,
the data-parallel metric mean, and the checkpoint writer's small collectives.

- Every rank ends with rank 0's values, each holding its own rows of an FSDP-sharded
  parameter: each rank builds the model from a different seed, so only the broadcast from
  rank 0 can make them agree; the expected values are rank 0's model rebuilt from its seed and
  cut by hand (`tensor_split`).
- No mesh or plan under a 2-rank world means data-parallel over both ranks.
- `mean_over_data_parallel` averages the float leaves of a metrics tree over the ranks (the
  mean of the ranks' values, written out) and passes the others through unchanged.
- The writer's collectives: `agree` is True only when every rank is, `max_over_ranks` is the
  largest value, `share_text` gives every rank rank 0's text exactly (or None).

The one-process paths are in test_parallel_plans.py and test_parallel_compute.py; the whole
training matrix on several ranks is test_parallel_multirank.py (minutes).
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD = 2


def _model(seed):
    torch.manual_seed(seed)
    # float32 and float64 parameters: the broadcast groups them in one flat chunk per dtype
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2).double())


def _check_shard_params(rank, mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from functrain.parallel import placement, plans

    expected = {k: v.detach().clone() for k, v in _model(100).named_parameters()}  # rank 0's
    layouts = {}
    for plan in ("ddp", "fsdp"):
        model = _model(100 + rank)  # a different start on every rank
        params = {k: v.detach() for k, v in model.named_parameters()}
        placed, layouts[plan] = placement.shard_params(model, params, mesh=mesh, plan=plan)
        for name, value in placed.items():
            assert isinstance(value, DTensor) and value.dtype == expected[name].dtype
            assert torch.equal(value.full_tensor(), expected[name]), (plan, name)
            if plan == "fsdp":  # dp_shard is the mesh's second dim: rank r holds chunk r of dim 0
                assert value.placements[1] == Shard(0)
                mine = torch.tensor_split(expected[name], WORLD, dim=0)[rank]
                assert torch.equal(value.to_local(), mine), (plan, name)
            else:
                assert all(p == Replicate() for p in value.placements)
    # neither mesh nor plan, 2 ranks: data-parallel over both (as Composer and Lightning do)
    default_mesh, default_plan = plans.default_placement(None, None)
    assert default_plan.name == "ddp" and default_mesh.size() == WORLD
    assert plans.launched_world_size() == WORLD
    return layouts["fsdp"]


def _check_metric_mean(rank, layout):
    from functrain.parallel import compute

    # rank 0 reports (1.0, [2, 4], count 3); rank 1 (3.0, [6, 8], count 5)
    tree = {
        "loss": torch.tensor(1.0 + 2 * rank),
        "parts": [torch.tensor([2.0, 4.0]) + 4 * rank, torch.tensor(0.5, dtype=torch.float64)],
        "count": torch.tensor(3 + 2 * rank),  # an integer tensor: passes through, not averaged
        "name": "train",
        "n": 7 + rank,
    }
    out = compute.mean_over_data_parallel(tree, layout)
    assert torch.equal(out["loss"], torch.tensor(2.0))
    assert torch.equal(out["parts"][0], torch.tensor([4.0, 6.0]))
    assert out["parts"][1].dtype == torch.float64 and float(out["parts"][1]) == 0.5
    assert torch.equal(out["count"], torch.tensor(3 + 2 * rank))
    assert out["name"] == "train" and out["n"] == 7 + rank
    # a tree with no float leaves comes back as it is, without a collective
    ints = {"count": torch.tensor(rank), "n": rank}
    assert compute.mean_over_data_parallel(ints, layout) is ints


def _check_writer_collectives(rank):
    from functrain.checkpoint import writer

    assert writer.agree(True) is True
    assert writer.agree(rank == 0) is False  # rank 1 failed: every rank hears it
    assert writer.max_over_ranks(3 + 4 * rank) == 7
    text = "step 12: h\u00e9llo w\u00f6rld"  # multi-byte UTF-8
    assert writer.share_text(text if rank == 0 else None) == text
    assert writer.share_text("" if rank == 0 else None) == ""  # empty, not None
    assert writer.share_text(None) is None


def _worker(rank, store_file):
    from functrain import parallel as fdist

    torch.set_num_threads(1)
    fdist.init_distributed("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD)
    layout = _check_shard_params(rank, fdist.init_mesh())
    _check_metric_mean(rank, layout)
    _check_writer_collectives(rank)


@pytest.mark.slow
def test_two_ranks_shard_params_metric_mean_and_writer_collectives(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    mp.spawn(_worker, args=(str(tmp_path / "store"),), nprocs=WORLD, join=True)
