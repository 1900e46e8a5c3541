"""The layout is a value: two models in one process, and where a state's layout travels.

One process on a one-rank mesh (the multi-rank side: test_parallel_multirank's side_by_side).
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import functrain
from functrain import checkpoint
from functrain import parallel as fdist
from functrain.data import Loader, place
from functrain.parallel import plans
from functrain.tree import tree_leaves, tree_map

BF16 = plans.fsdp(param_dtype=torch.bfloat16)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x).float(), y)


def _batches(n=3):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=gen), torch.randn(4, 2, generator=gen)) for _ in range(n)]


def _model_state_step(mesh, plan, seed=0):
    torch.manual_seed(seed)
    model = Net()
    opt = functrain.optim.sgd(0.1)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
    return model, state, functrain.make_step(model, _loss, opt)


def test_a_second_model_with_the_same_names_leaves_the_first_alone(mesh1):
    """The issue's reproduction: A under fsdp(bf16), then B (same names) under fsdp(); A's next
    steps work and equal A trained alone, bit for bit; B trains in fp32 as B alone does."""
    model_a, a, step_a = _model_state_step(mesh1, BF16)
    first, second, third = _batches()
    a, _ = step_a(a, first)
    model_b, b, step_b = _model_state_step(mesh1, "fsdp", seed=1)
    a, _ = step_a(a, second)  # failed with "mat1 and mat2 must have the same dtype" before
    a, _ = step_a(a, third)
    b, _ = step_b(b, first)

    _, alone, step_alone = _model_state_step(mesh1, BF16)
    for batch in (first, second, third):
        alone, _ = step_alone(alone, batch)
    _, b_alone, step_b_alone = _model_state_step(mesh1, "fsdp", seed=1)
    b_alone, _ = step_b_alone(b_alone, first)
    for got, want in ((a, alone), (b, b_alone)):
        for name, value in fdist.full_params(want.params).items():
            assert torch.equal(fdist.full_params(got.params)[name], value), name
    assert step_a.pieces.call_model(a, first[0]).dtype == torch.bfloat16
    assert step_b.pieces.call_model(b, first[0]).dtype == torch.float32
    assert a.layout != b.layout and a.layout.policy("fc1.weight").param_dtype is torch.bfloat16


def test_the_layout_travels_with_the_state(mesh1, tmp_path):
    model, state, step = _model_state_step(mesh1, "fsdp")
    layout = state.layout
    assert state.replace(step=3).layout is layout
    state, _ = step(state, _batches(1)[0])
    assert state.layout is layout  # the step keeps it
    doubled = tree_map(lambda x: x * 2 if isinstance(x, torch.Tensor) else x, state)
    assert doubled.layout is layout
    assert not any(isinstance(x, fdist.Layout) for x in tree_leaves(state))  # not a leaf
    assert copy.deepcopy(state).layout is layout
    checkpoint.save(str(tmp_path / "ckpt"), state)
    _, like, _ = _model_state_step(mesh1, "fsdp", seed=5)
    loaded = checkpoint.load(str(tmp_path / "ckpt"), like=like)
    assert loaded.layout is like.layout
    assert torch.equal(
        fdist.full_params(loaded.params)["fc1.weight"],
        fdist.full_params(state.params)["fc1.weight"],
    )
    loaded, _ = step(loaded, _batches(1)[0])  # the loaded state steps
    assert loaded.step == 2


def test_states_of_different_layouts_have_different_structures(mesh1):
    _, a, _ = _model_state_step(mesh1, "fsdp")
    _, b, _ = _model_state_step(mesh1, BF16)
    with pytest.raises(ValueError):
        tree_map(lambda x, y: x, a, b)
    _, c, _ = _model_state_step(mesh1, "fsdp", seed=3)
    assert a.layout == c.layout and hash(a.layout) == hash(c.layout)  # equal by value
    tree_map(lambda x, y: x, a, c)


def test_frozen_parameters_keep_to_frozen_buckets(mesh1):
    torch.manual_seed(0)
    model = Net()
    model.fc1.requires_grad_(False)
    state = functrain.init(model, functrain.optim.sgd(0.1), mesh=mesh1, plan="fsdp")
    flags = {name: b.frozen for b in state.layout.buckets for name in b.names}
    assert flags == {"fc1.weight": True, "fc1.bias": True, "fc2.weight": False, "fc2.bias": False}


def test_local_and_default_placements(mesh1):
    assert plans.default_placement(None, "local") == (None, None)
    assert plans.default_placement(None, None) == (None, None)  # a world of one process
    with pytest.raises(ValueError, match="takes no mesh"):
        plans.default_placement(mesh1, "local")
    with pytest.raises(ValueError, match="tp dim"):
        plans.default_placement(None, "tp")
    state = functrain.init(Net(), functrain.optim.sgd(0.1), plan="local")
    assert state.layout is None


def test_a_loader_is_placed_by_the_layout_unless_told_otherwise():
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader = Loader(data, batch_size=4, shuffle=False)
    placed = place(loader, 1, 2)
    assert (placed.rank, placed.world_size) == (1, 2) and placed is not loader
    assert [b[0].tolist() for b in placed] == [[2.0, 3.0], [6.0, 7.0]]
    assert (loader.rank, loader.world_size) == (0, 1)  # the original is unchanged
    own = Loader(data, batch_size=4, rank=0, world_size=1)
    assert place(own, 1, 2) is own  # an explicit placement wins
    assert place([1, 2], 1, 2) == [1, 2]  # other data shards itself


@pytest.mark.slow
def test_compile_step_runs_under_a_layout(mesh1):
    """compile_step with an fsdp layout (input cast installed outside the graph) equals eager."""
    results = []
    for compiled in (False, True):
        _, state, step = _model_state_step(mesh1, "fsdp")
        if compiled:
            step = functrain.compile_step(step)
        for batch in _batches():
            state, _ = step(state, batch)
        assert state.layout is not None
        results.append(fdist.full_params(state.params))
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=0, atol=1e-5)
