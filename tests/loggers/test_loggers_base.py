"""Logger base: one host transfer per log call, rank-0 gating, image normalisation."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from functrain.loggers import Logger, as_uint8_nhwc, to_floats
from functrain.loggers.base import import_optional


class ListLogger(Logger):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.rows = []

    def write_metrics(self, values, step):
        self.rows.append((step, values))


def test_to_floats_flattens_and_drops_non_scalars():
    metrics = {
        "loss": torch.tensor(0.5),
        "lr": 1e-3,
        "samples": 32,
        "skipped": torch.tensor(False),
        "grad_norms": {"fc.weight": torch.tensor([2.0]), "fc.bias": 1.0},
        "outputs": torch.zeros(4, 10),
        "note": "text",
        "missing": None,
    }
    assert to_floats(metrics) == {
        "loss": 0.5,
        "lr": 1e-3,
        "samples": 32.0,
        "skipped": 0.0,
        "grad_norms/fc.weight": 2.0,
        "grad_norms/fc.bias": 1.0,
    }


def test_one_host_transfer_per_call(counting):
    values = to_floats({"a": counting(1.0), "b": counting(2.0), "c": {"d": counting(3.0)}})
    assert values == {"a": 1.0, "b": 2.0, "c/d": 3.0}
    assert counting.reads == ["tolist"]


def test_rank_gating(make_ctx):
    ranked = ListLogger()
    ranked.init(make_ctx(rank=1))
    ranked.log_metrics({"loss": 1.0}, step=3)
    assert ranked.rows == [] and not ranked.active
    everywhere = ListLogger(all_ranks=True)
    everywhere.init(make_ctx(rank=1))
    everywhere.log_metrics({"loss": torch.tensor(1.0)}, step=3)
    assert everywhere.rows == [(3, {"loss": 1.0})]


def test_rank_from_torch_distributed_before_any_event():
    logger = ListLogger()
    assert logger.rank == 0 and logger.active  # no process group: rank 0


def test_images_become_uint8_nhwc():
    assert as_uint8_nhwc(np.zeros((5, 6))).shape == (1, 5, 6, 1)
    floats = torch.tensor([[[0.0, 0.5, 1.0]]])  # (1, 1, 3): an RGB pixel
    assert as_uint8_nhwc(floats).tolist() == [[[[0, 128, 255]]]]
    with pytest.raises(ValueError, match="channels last"):
        as_uint8_nhwc(np.zeros((2, 3, 8, 8)))


def test_optional_backends_import_or_say_what_to_install(monkeypatch):
    assert import_optional("json", "pip install json").dumps([1]) == "[1]"
    monkeypatch.setitem(sys.modules, "functrain_missing_backend", None)
    with pytest.raises(ImportError, match="pip install functrain-missing") as info:
        import_optional("functrain_missing_backend", "pip install functrain-missing")
    assert isinstance(info.value.__cause__, ImportError)
