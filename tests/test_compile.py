"""compile_step: the gradient piece compiles once for a run, its graph is what runs, and the
compiled step equals the eager one."""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend

import functrain
from functrain import optim, schedules
from functrain.tree import tree_allclose, tree_clone


class CountingBackend:
    """A torch.compile backend that counts the graphs it compiles and the calls of each."""

    def __init__(self, inner: str):
        self.inner = lookup_backend(inner)
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        compiled = self.inner(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)

        return run


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=False),
        torch.nn.BatchNorm1d(16),  # in-place running statistics must compile too
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),  # the seeded global generator, outside the graph
        torch.nn.Linear(16, 3),
    )


def loss_fn(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def make_batches(n):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


OPTIMIZER = optim.chain(
    optim.clip_by_global_norm(1.0),
    optim.adamw(1e-2 * schedules.cosine_annealing_with_warmup("5ba", t_max="100ba")),
)


def test_compiled_step_compiles_once_runs_its_graph_and_matches_eager_after_100_steps():
    model = make_model()
    state = functrain.init(model, OPTIMIZER, seed=0)
    step = functrain.make_step(model, loss_fn, OPTIMIZER)
    backend = CountingBackend("inductor")
    compiled = functrain.compile_step(step, backend=backend)
    eager_state, compiled_state = tree_clone(state), tree_clone(state)
    torch._dynamo.utils.counters.clear()
    batches = make_batches(100)
    # fallback_random: dropout in the graph draws from torch's generator, as eager does (the
    # step seeds it from the state's key either way), so the two runs can agree
    with torch._inductor.config.patch(fallback_random=True):
        for batch in batches:
            eager_state, eager_metrics = step(eager_state, batch)
            compiled_state, compiled_metrics = compiled(compiled_state, batch)
    # The step and optimizer counts and the lr changed every step: none of it is guarded on.
    assert backend.graphs == 1, torch._dynamo.utils.counters["recompiles"]
    assert backend.calls == len(batches)  # the compiled graph ran, every step
    assert not torch._dynamo.utils.counters["graph_break"]
    assert tree_allclose(eager_state.params, compiled_state.params, atol=1e-4, rtol=1e-4)
    assert tree_allclose(eager_state.opt_state, compiled_state.opt_state, atol=1e-4, rtol=1e-4)
    assert tree_allclose(eager_state.buffers, compiled_state.buffers, atol=1e-4, rtol=1e-4)
    assert torch.allclose(eager_metrics["loss"], compiled_metrics["loss"], atol=1e-4)
    assert compiled_metrics["lr"] == pytest.approx(eager_metrics["lr"])
    assert compiled_state.step == 100 and compiled_state.timestamp.sample == 800


def test_compiled_step_through_fit_compiles_once_and_leaves_a_pure_input_untouched():
    model = make_model()
    state = functrain.init(model, OPTIMIZER, seed=0)
    backend = CountingBackend("aot_eager")
    compiled = functrain.compile_step(
        functrain.make_step(model, loss_fn, OPTIMIZER), backend=backend
    )
    batches = make_batches(4)
    snapshot = tree_clone(state)
    compiled(state, batches[0])  # pure: the input state is untouched
    assert tree_allclose(state.params, snapshot.params, atol=0, rtol=0)
    assert tree_allclose(state.buffers, snapshot.buffers, atol=0, rtol=0)
    graphs = backend.graphs
    final = functrain.fit(
        compiled, state, batches, duration="3ep", log_interval=None, eval_interval=None
    )
    assert final.step == 12
    assert backend.graphs == graphs + 1  # fit's donated step: one more graph, then no other


def test_a_compiled_step_takes_the_gradient_norm_once_per_step(monkeypatch):
    # The step takes the global norm for its `grad_norm` metric and hands it to the update, whose
    # fused global-norm clip would otherwise take it again. compile_step's copy of the step must
    # keep that hand-over (it once lost it: the copy's update piece was no longer recognised).
    import functrain._torch as private
    from functrain.optim import clipping, kernels

    taken = []

    def counting(name, real):
        def wrapper(*args, **kwargs):
            taken.append(name)
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(private, "foreach_norm", counting("step", private.foreach_norm))
    monkeypatch.setattr(kernels, "global_norm", counting("fused clip", kernels.global_norm))
    monkeypatch.setattr(clipping, "global_norm", counting("clip", clipping.global_norm))
    model = make_model()
    state = functrain.init(model, OPTIMIZER, seed=0)
    step = functrain.make_step(model, loss_fn, OPTIMIZER)
    for run in (step, functrain.compile_step(step, backend="eager")):
        taken.clear()
        run_state = tree_clone(state)
        for batch in make_batches(3):
            run_state, metrics = run(run_state, batch)
        assert taken == ["step"] * 3, (type(run).__name__, taken)
        assert torch.isfinite(metrics["grad_norm"])
