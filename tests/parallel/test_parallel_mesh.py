"""The named mesh and process-group setup (one process; multi-rank in test_parallel_multirank)."""

import pytest
import torch

import functrain
from functrain import parallel as fdist
from functrain.parallel import mesh as fmesh


def test_resolve_sizes_infers_the_free_dim():
    assert fmesh._resolve_sizes(8, dp_replicate=2, dp_shard=-1, tp=2) == (2, 2, 2)
    assert fmesh._resolve_sizes(4, dp_replicate=1, dp_shard=-1, tp=1) == (1, 4, 1)
    assert fmesh._resolve_sizes(6, dp_replicate=-1, dp_shard=3, tp=1) == (2, 3, 1)


@pytest.mark.parametrize(
    "world, sizes, message",
    [
        (4, dict(dp_replicate=1, dp_shard=-1, tp=3), "not divisible"),
        (4, dict(dp_replicate=-1, dp_shard=-1, tp=1), "only one dim"),
        (4, dict(dp_replicate=1, dp_shard=3, tp=1), "the world has 4 ranks"),
        (4, dict(dp_replicate=0, dp_shard=-1, tp=1), "positive int"),
    ],
)
def test_resolve_sizes_errors_name_the_problem(world, sizes, message):
    with pytest.raises(ValueError, match=message):
        fmesh._resolve_sizes(world, **sizes)


def test_incomplete_environment_is_a_clear_error(monkeypatch):
    if torch.distributed.is_initialized():
        pytest.skip("a process group already exists in this process")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(RuntimeError, match="incomplete distributed environment"):
        fdist.init_distributed()


def test_single_process_default_needs_no_environment(mesh1, monkeypatch):
    assert mesh1.mesh_dim_names == fdist.MESH_DIMS
    assert tuple(mesh1.shape) == (1, 1, 1)
    assert fmesh.dp_size(mesh1) == 1 and fmesh.dp_rank(mesh1) == 0
    assert torch.distributed.get_world_size() == 1


def test_no_layout_means_one_process():
    assert fdist.data_parallel_info(None) == (0, 1)
    value = torch.tensor(3.0)
    assert fdist.mean_over_data_parallel(value, None) is value
    with pytest.raises(TypeError, match="Layout"):
        fdist.data_parallel_info("fsdp")


def test_making_a_mesh_leaves_no_process_state(mesh1):
    """A mesh is a value: after one was made, a state built without it has no layout."""
    state = functrain.init(torch.nn.Linear(2, 1), functrain.optim.sgd(lr=0.1))
    assert state.layout is None and fdist.data_parallel_info(state.layout) == (0, 1)


def test_check_mesh_rejects_foreign_objects(mesh1):
    with pytest.raises(TypeError, match="DeviceMesh"):
        fmesh.check_mesh("not a mesh")
    flat = mesh1["dp_shard"]
    with pytest.raises(ValueError, match="dims"):
        fmesh.check_mesh(flat)
