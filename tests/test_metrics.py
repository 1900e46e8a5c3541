"""Tests of functrain.metrics: values against direct computation, and the cross-rank reduction."""

import json
import math
import os
import socket
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain.parallel
from functrain.metrics import (
    Accuracy,
    CrossEntropy,
    Mean,
    Perplexity,
    TorchMetric,
    as_metric,
    logits_of,
    resolve_metrics,
)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    classes=st.integers(2, 7),
    seed=st.integers(0, 10_000),
)
def test_metrics_over_batches_equal_the_whole(sizes, classes, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(sum(sizes), classes, generator=gen)
    targets = torch.randint(0, classes, (sum(sizes),), generator=gen)
    acc, ce, ppl, top2 = Accuracy(), CrossEntropy(), Perplexity(), Accuracy(top_k=2)
    for chunk_logits, chunk_targets in zip(logits.split(sizes), targets.split(sizes)):
        for metric in (acc, ce, ppl, top2):
            metric.update(chunk_logits, chunk_targets)
    expected_ce = F.cross_entropy(logits.double(), targets).item()
    assert acc.compute() == pytest.approx((logits.argmax(-1) == targets).double().mean().item())
    top = logits.topk(2, dim=-1).indices
    assert top2.compute() == pytest.approx((top == targets[:, None]).any(-1).double().mean().item())
    assert ce.compute() == pytest.approx(expected_ce, rel=1e-5)
    assert ppl.compute() == pytest.approx(math.exp(expected_ce), rel=1e-5)


def test_sequence_logits_ignore_index_and_hf_outputs():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    targets[0, :2] = -100
    keep = targets != -100
    outputs = types.SimpleNamespace(logits=logits)  # like a Hugging Face ModelOutput
    ce, acc = CrossEntropy(), Accuracy(ignore_index=-100)
    ce.update(outputs, targets)
    acc.update({"logits": logits}, targets)
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), ignore_index=-100)
    assert ce.compute() == pytest.approx(expected.item(), rel=1e-5)
    assert acc.compute() == pytest.approx(
        (logits.argmax(-1) == targets)[keep].double().mean().item()
    )


def test_probability_targets_binary_logits_and_reset():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    probs = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.2, 0.3]])
    ce, acc = CrossEntropy(), Accuracy()
    ce.update(logits, probs)
    acc.update(logits, probs)
    assert ce.compute() == pytest.approx(F.cross_entropy(logits, probs).item(), rel=1e-6)
    assert acc.compute() == 0.5  # second sample: likeliest class 0, predicted 2
    binary = Accuracy()
    binary.update(torch.tensor([1.5, -0.3, 0.2]), torch.tensor([1, 0, 0]))
    assert binary.compute() == pytest.approx(2 / 3)
    column = Accuracy()
    column.update(torch.tensor([[1.5], [-0.3], [0.2]]), torch.tensor([1, 0, 0]))
    assert column.compute() == pytest.approx(2 / 3)
    binary.reset()
    binary.update(torch.tensor([1.0]), torch.tensor([1]))
    assert binary.compute() == 1.0


def test_values_match_torchmetrics():
    import torchmetrics  # imported here: it takes seconds, and only these tests need it

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 9, 5, generator=gen)
    targets = torch.randint(0, 5, (6, 9), generator=gen)
    targets[:, :3] = -100
    ppl, acc = Perplexity(), Accuracy(ignore_index=-100)
    reference_ppl = torchmetrics.text.Perplexity(ignore_index=-100)
    reference_acc = torchmetrics.classification.MulticlassAccuracy(
        5, average="micro", ignore_index=-100
    )
    for chunk in range(3):
        part = slice(2 * chunk, 2 * chunk + 2)
        ppl.update(logits[part], targets[part])
        acc.update(logits[part], targets[part])
        reference_ppl.update(logits[part], targets[part])
        reference_acc.update(logits[part].reshape(-1, 5), targets[part].reshape(-1))
    assert ppl.compute() == pytest.approx(float(reference_ppl.compute()), rel=1e-5)
    assert acc.compute() == pytest.approx(float(reference_acc.compute()), rel=1e-6)


def test_mean_and_torchmetrics_wrapping():
    import torchmetrics

    mean = Mean("loss")
    mean.update(torch.tensor(2.0), 3)
    mean.update(4.0, 1)
    assert mean.compute() == 2.5
    f1 = as_metric(torchmetrics.classification.MulticlassF1Score(3, average="micro"), "f1")
    assert isinstance(f1, TorchMetric) and f1.name == "f1"
    f1.update(torch.tensor([[3.0, 0, 0], [0, 3.0, 0]]), torch.tensor([0, 2]))
    assert f1.compute() == pytest.approx(0.5)


def test_resolve_metrics_and_errors():
    resolved = resolve_metrics(["accuracy", Perplexity()])
    assert list(resolved) == ["accuracy", "perplexity"]
    assert list(resolve_metrics({"top5": Accuracy(top_k=5)})) == ["top5"]
    assert resolve_metrics(None) == {}
    with pytest.raises(ValueError, match="two metrics are named 'accuracy'"):
        resolve_metrics(["accuracy", Accuracy()])
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        resolve_metrics(["f1"])
    with pytest.raises(TypeError, match="update/compute/reset"):
        as_metric(3.0)
    with pytest.raises(ValueError, match="do not match logits"):
        Accuracy().update(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="cannot find logits"):
        logits_of("text")
    assert math.isnan(Accuracy().compute())  # nothing seen


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(10, 4, generator=gen), torch.randint(0, 4, (10,), generator=gen)


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    """One rank of the cross-rank test (run in a fresh interpreter)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        logits, targets = _data()
        shard = slice(0, 7) if rank == 0 else slice(7, 10)  # uneven shards
        metrics = [Accuracy(), CrossEntropy(), Perplexity(), Mean("m")]
        for metric in metrics[:3]:
            metric.update(logits[shard], targets[shard])
        metrics[3].update(float(rank + 1), weight=7 if rank == 0 else 3)
        with open(out, "w") as f:
            json.dump([m.compute() for m in metrics], f)
    finally:
        functrain.parallel.shutdown()  # not a bare destroy: see test_torch_private


@pytest.mark.slow
def test_metrics_reduce_over_ranks_as_one_dataset(tmp_path):
    port = _free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    procs = []
    for rank in range(2):
        code = (
            f"import sys; sys.path[:0] = [{here!r}, {root!r}]; import test_metrics; "
            f"test_metrics._rank_main({rank}, 2, {port}, {str(tmp_path / f'{rank}.json')!r})"
        )
        procs.append(subprocess.Popen([sys.executable, "-c", code]))
    for p in procs:
        assert p.wait(timeout=120) == 0
    logits, targets = _data()
    ce = F.cross_entropy(logits.double(), targets).item()
    expected = [(logits.argmax(-1) == targets).double().mean().item(), ce, math.exp(ce), 1.3]
    for rank in range(2):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got == pytest.approx(expected, rel=1e-6)
