"""The step's `ForwardRun`: what is installed on the model for one forward, in one declared order.

Pairs that interact on 2 ranks (tensor parallelism under activation checkpointing, FSDP's gather
at use under activation offload): tests/parallel/test_parallel_forward_run.py.
"""

import contextlib
import importlib

import pytest
import torch
import torch.nn as nn

import functrain
from functrain import parallel as fdist
from functrain.algorithms import activation_checkpointing, activation_offload
from functrain.algorithms.activation_checkpointing import StandIn
from functrain.parallel import plans as fplans
from functrain.step import forward_run
from functrain.step.forward_run import ORDER, ForwardRun, Installer, ordered

# the module (`functrain.parallel.running` the attribute is the function of the same name)
running = importlib.import_module("functrain.parallel.running")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def mse(model, batch):
    x, y = batch
    return ((model(x).float() - y) ** 2).mean()


def batches(n=2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 1, generator=g)) for _ in range(n)]


def recording(log, name, layout_args=False):
    """An installer logging its entry and exit (`layout_args`: called as the layout's are, with
    `(model, layout, inflight)`)."""

    @contextlib.contextmanager
    def install(*args):
        assert len(args) == (3 if layout_args else 1)
        log.append(("enter", name))
        yield
        log.append(("exit", name))

    return install


def test_the_order_is_the_declared_one():
    assert ORDER == (
        "input_cast",
        "tensor_parallel",
        "gather_at_use",
        "slots",
        "offload",
        "activation_checkpointing",
    )
    assert running.LAYOUT_ORDER + ("slots",) + forward_run.LOSS_INSTALLERS == ORDER
    # a recomputation redoes only what acts when a module is called, in the same order
    assert [n for n in ORDER if n in running.RECOMPUTE_ORDER] == list(running.RECOMPUTE_ORDER)


@pytest.mark.parametrize("composed", [("offload", "activation_checkpointing"),
                                      ("activation_checkpointing", "offload")])  # fmt: skip
def test_algorithm_installers_enter_in_the_declared_order_whatever_the_composition(composed):
    log = []
    installers = tuple(Installer(name, recording(log, name)) for name in composed)
    run = ForwardRun(nn.Linear(2, 2), None, None, ordered(installers))
    out = run.call_loss("model", lambda model, batch: log.append(("loss", batch)) or 7, "batch")
    assert out == 7
    assert log == [
        ("enter", "offload"),
        ("enter", "activation_checkpointing"),
        ("loss", "batch"),
        ("exit", "activation_checkpointing"),
        ("exit", "offload"),
    ]


def test_the_layout_installers_enter_in_the_declared_order(monkeypatch):
    log = []
    for name in running.LAYOUT_ORDER:
        monkeypatch.setitem(running._LAYOUT, name, recording(log, name, layout_args=True))
    for name in running.RECOMPUTE_ORDER:
        monkeypatch.setitem(running._RECOMPUTE, name, recording(log, "re-" + name, True))
    run = ForwardRun(nn.Linear(2, 2), layout=object())
    with run.installed():
        log.append(("forward", None))
    with run.recomputing():
        log.append(("recompute", None))
    assert log == [
        ("enter", "input_cast"),
        ("enter", "tensor_parallel"),
        ("enter", "gather_at_use"),
        ("forward", None),
        ("exit", "gather_at_use"),
        ("exit", "tensor_parallel"),
        ("exit", "input_cast"),
        ("enter", "re-tensor_parallel"),
        ("enter", "re-gather_at_use"),
        ("recompute", None),
        ("exit", "re-gather_at_use"),
        ("exit", "re-tensor_parallel"),
    ]


def test_without_a_layout_nothing_is_installed_and_no_context_is_made():
    run = ForwardRun(nn.Linear(2, 2))
    assert run.installed() is run.recomputing() is running._NOTHING
    assert run.gathered_at_use is None


def test_an_installer_with_no_place_in_the_order_is_refused():
    with pytest.raises(ValueError, match="no place in the forward run's order"):
        ordered((Installer("slots", recording([], "slots")),))


@pytest.mark.parametrize("reverse", [False, True])
def test_offload_stays_outside_checkpointing_in_either_composition_order(reverse):
    seen = []

    def observing(model, batch):
        chain, module = [], model.blocks._modules["1"]  # every=2: the 2nd block has both
        while isinstance(module, StandIn):
            chain.append(type(module).__name__)
            module = module.inner
        seen.append((chain, BOUND not in vars(model)))
        return mse(model, batch)

    algorithms = [activation_offload(Block), activation_checkpointing(Block, every=2)]
    algorithms = algorithms[::-1] if reverse else algorithms

    def run(algorithms, loss):
        torch.manual_seed(0)
        net = Net()
        opt = functrain.optim.sgd(0.1)
        state = functrain.init(net, opt)
        step = functrain.compose(functrain.make_step(net, loss, opt), *algorithms)
        for batch in batches():
            state, _ = step(state, batch)
        assert all(type(m) is not StandIn for m in net.modules())  # nothing left after
        return state.params

    got, plain = run(algorithms, observing), run([], mse)
    assert seen[0] == (["_Offloaded", "_Recomputed"], True)  # and nothing bound to the model
    for k in plain:
        torch.testing.assert_close(got[k], plain[k], rtol=1e-6, atol=1e-7)


BOUND = "_functrain_inflight"  # what the model carried during a forward before the run object


@pytest.fixture(scope="module")
def mesh1():
    mesh = fdist.init_mesh()
    yield mesh
    fdist.shutdown()


@pytest.mark.slow
def test_compile_over_a_run_with_several_installers_equals_eager(mesh1):
    """Input cast (param_dtype), slots, offload and checkpointing under `compile_step`."""

    def run(compiled):
        torch.manual_seed(0)
        net = Net()
        opt = functrain.optim.sgd(0.1)
        plan = fplans.fsdp(param_dtype=torch.float64)
        state = functrain.init(net, opt, seed=0, mesh=mesh1, plan=plan)
        step = functrain.compose(
            functrain.make_step(net, mse, opt),
            activation_checkpointing(Block, every=2),
            activation_offload(Block),
        )
        step = functrain.compile_step(step, backend="aot_eager") if compiled else step
        for batch in batches():
            state, _ = step(state, batch)
        return fdist.full_params(state.params)

    eager, compiled = run(False), run(True)
    for k in eager:
        torch.testing.assert_close(compiled[k], eager[k], rtol=1e-6, atol=1e-7)


def test_nothing_in_functrain_reads_torchs_global_hook_registries():
    import pathlib
    import re

    root = pathlib.Path(functrain.__file__).parent
    registries = re.compile(
        r"_global_(forward_pre|forward|backward_pre|backward|module_registration)"
    )
    readers = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if registries.search(path.read_text())
    ]
    assert readers == []
