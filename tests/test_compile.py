"""compile_step: the whole step under torch.compile equals the eager step."""

import torch
import torch.nn.functional as F

import functrain
from functrain import optim
from functrain.tree import tree_allclose, tree_clone


def test_compiled_step_matches_eager_step_and_does_not_break_the_graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=False),
        torch.nn.BatchNorm1d(16),  # in-place running statistics must compile too
        torch.nn.ReLU(),
        torch.nn.Linear(16, 3),
    )
    opt = optim.adamw(lr=1e-2)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), opt)
    compiled = functrain.compile_step(step)
    gen = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(4)
    ]
    eager_state, compiled_state = tree_clone(state), tree_clone(state)
    torch._dynamo.utils.counters.clear()
    for batch in batches:
        eager_state, eager_metrics = step(eager_state, batch)
        compiled_state, compiled_metrics = compiled(compiled_state, batch)
    assert tree_allclose(eager_state.params, compiled_state.params, atol=1e-5)
    assert tree_allclose(eager_state.opt_state, compiled_state.opt_state, atol=1e-5)
    assert tree_allclose(eager_state.buffers, compiled_state.buffers, atol=1e-5)
    assert torch.allclose(eager_metrics["loss"], compiled_metrics["loss"], atol=1e-5)
    assert compiled_state.step == 4 and compiled_state.timestamp.sample == 32
    assert not torch._dynamo.utils.counters["graph_break"]
