"""ModelSummary: per-module counts, trainable, dtype, sharding, sizes; printed once at FIT_START."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

import functrain
from functrain.callbacks import ModelSummary
from functrain.callbacks.model_summary import format_summary, summarize


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)),
    )


def test_rows_count_every_parameter_of_their_module():
    model = cnn()
    model[0].requires_grad_(False)
    model[2][2].half()
    state = functrain.init(model, functrain.optim.sgd(lr=0.1))
    rows = summarize(state.params, model, max_depth=2)
    by_name = {r.name: r for r in rows}
    assert [r.name for r in rows] == ["0", "1", "2", "2.1", "2.2", "total"]
    for r in rows[:-1]:
        module = model.get_submodule(r.name)
        assert r.type == type(module).__name__
        assert r.params == sum(p.numel() for p in module.parameters())
        assert r.trainable == sum(p.numel() for p in module.parameters() if p.requires_grad)
        assert r.nbytes == sum(p.numel() * p.element_size() for p in module.parameters())
        assert r.sharding == {"-"}
    assert by_name["0"].trainable == 0 and by_name["2"].dtypes == {"float32", "float16"}
    total = by_name["total"]
    assert total.params == sum(p.numel() for p in model.parameters()) == 142
    assert total.trainable == 142 - 80
    # Depth 1 rows partition the parameters: their counts add up to the total.
    depth1 = summarize(state.params, model, max_depth=1)
    assert sum(r.params for r in depth1[:-1]) == depth1[-1].params == 142


def test_the_text_has_the_totals_and_the_buffers():
    model = cnn()
    model[0].requires_grad_(False)
    state = functrain.init(model, functrain.optim.sgd(lr=0.1))
    text = format_summary(summarize(state.params, model), state.buffers)
    lines = text.splitlines()
    assert lines[0].split() == ["|", "Name", "|", "Type", "|", "Params", "|", "Trainable", "|",
                                "Dtype", "|", "Sharding", "|", "Size"]  # fmt: skip
    assert lines[1].split("|")[2].strip() == "Conv2d"
    assert "142       Total params" in lines
    assert "62        Trainable params" in lines and "80        Non-trainable params" in lines
    assert "568 B     Total size of the parameters" in lines
    assert "72 B      Buffers (3 tensors)" in lines  # running mean/var (8 + 8 floats) + count


def test_without_the_model_trainable_is_unknown():
    state = functrain.init(cnn(), functrain.optim.sgd(lr=0.1))
    rows = summarize(state.params)
    assert all(r.trainable is None and r.type == "-" for r in rows)
    assert "pass the model" in format_summary(rows)
    with pytest.raises(ValueError, match="max_depth"):
        summarize(state.params, max_depth=0)


def test_dtensor_placements_and_the_local_size(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        params = {
            "a.weight": distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)]),
            "a.bias": distribute_tensor(torch.ones(4), mesh, [Replicate()]),
            "b.weight": torch.ones(2, 2, dtype=torch.bfloat16),
        }
        rows = {r.name: r for r in summarize(params)}
    finally:
        torch.distributed.destroy_process_group()
    assert rows["a"].sharding == {"(S(0))", "(R)"}  # one placement per mesh dimension
    assert rows["a"].params == 16 and rows["a"].nbytes == 64 == rows["a"].local_nbytes
    assert rows["b"].sharding == {"-"} and rows["b"].nbytes == 8
    assert rows["total"].dtypes == {"float32", "bfloat16"}


def test_printed_once_at_fit_start_on_rank_zero(make_ctx):
    model = cnn()
    state = functrain.init(model, functrain.optim.sgd(lr=0.1))
    printed: list[str] = []
    summary = ModelSummary(model, print_fn=printed.append)
    summary.fit_start(make_ctx(state, rank=1))
    assert printed == []
    summary.fit_start(make_ctx(state))
    assert printed == [format_summary(summarize(state.params, model), state.buffers)]


def test_through_fit_and_for_several_states():
    model = cnn()
    data = [(torch.randn(4, 1, 3, 3), torch.randint(0, 2, (4,))) for _ in range(3)]

    def loss_fn(m, batch):
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    opt = functrain.optim.sgd(lr=0.1)
    printed: list[str] = []
    step = functrain.make_step(model, loss_fn, opt)
    functrain.fit(step, functrain.init(model, opt), data, duration="3ba",
                  callbacks=[ModelSummary(model, print_fn=printed.append)])  # fmt: skip
    assert len(printed) == 1 and "142       Total params" in printed[0]

    other = torch.nn.Linear(2, 1)
    states = {"a": functrain.init(model, opt), "b": functrain.init(other, opt)}
    fit_state = functrain.loop.fit_state.FitState(states)
    summary = ModelSummary({"a": model, "b": other}, print_fn=printed.append)

    class Ctx:
        rank, state = 0, fit_state

    summary.fit_start(Ctx())
    assert summary.text.startswith("a:\n") and "\n\nb:\n" in summary.text
    assert "3         Total params" in summary.text  # b: a Linear(2, 1)


def test_docstring_examples():
    module = importlib.import_module("functrain.callbacks.model_summary")
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for name in ("summarize", "format_summary"):
        for test in finder.find(getattr(module, name), globs={**vars(module)}):
            runner.run(test)
    assert runner.failures == 0 and runner.tries == 3
