"""WandBLogger in wandb's offline mode (no network): metrics, config, images, resume into the same
run, through `fit` too. What reached W&B is read back from the run's own `.wandb` files."""

from __future__ import annotations

import glob
import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import functrain
from functrain.loggers import WandBLogger

pytest.importorskip("wandb")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def wandb_records(path: str) -> list:
    """The protobuf records of a `.wandb` file: a 7-byte header (":W&B", magic, version), then
    LevelDB-style log blocks of 32 KiB whose records are (crc32, length, type) + data."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # "a/b" keys are stored as nested keys


def history(directory) -> dict[str, list]:
    """run id -> [{metric: value}, ...] in logging order, over every offline run in `directory`."""
    out: dict[str, list] = {}
    for path in sorted(glob.glob(f"{directory}/wandb/offline-run-*/run-*.wandb")):
        run_id = None
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
                out.setdefault(run_id, [])
            elif kind == "history":
                row = {_key(i): json.loads(i.value_json) for i in record.history.item}
                out[run_id].append({k: v for k, v in row.items() if k[0] != "_" or k == "_step"})
    return out


def settled_history(directory, expected_rows: int) -> dict[str, list]:
    """`history`, waiting (up to a minute) for wandb's service to write the last records: a
    finished run's file may still be growing when `finish()` returns."""
    deadline = time.monotonic() + 60
    while True:
        runs = history(directory)
        if sum(len(rows) for rows in runs.values()) >= expected_rows or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def run_config(directory) -> dict:
    for path in sorted(glob.glob(f"{directory}/wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "run":
                return {_key(i): json.loads(i.value_json) for i in record.run.config.update}
    return {}


def test_metrics_config_images_and_resume_into_the_same_run(offline):
    logger = WandBLogger(project="digits", name="first", dir=offline)
    logger.log_hparams({"lr": 0.1, "model": "mlp", "shape": (3, 4)})
    logger.log_metrics({"train/loss": torch.tensor(1.0), "nested": {"a": 2.0}}, step=1)
    logger.log_metrics({"train/loss": 0.5}, step=2)
    logger.log_images("samples", np.full((2, 4, 4, 3), 200, dtype=np.uint8), step=2)
    saved = logger.state_dict()
    logger.close()
    assert saved["run_id"]

    resumed = WandBLogger(project="digits", dir=offline)
    resumed.load_state_dict(saved)
    resumed.log_metrics({"train/loss": 0.25}, step=4)
    resumed.close()

    runs = settled_history(offline, expected_rows=3)
    assert list(runs) == [saved["run_id"]]  # both processes wrote to one run
    rows = runs[saved["run_id"]]
    losses = [(r["_step"], r["train/loss"]) for r in rows if "train/loss" in r]
    assert losses == [(1, 1.0), (2, 0.5), (4, 0.25)]
    assert any(r.get("nested/a") == 2.0 for r in rows)
    assert any(r.get("samples/count") == 2 for r in rows)  # two images at step 2
    config = run_config(offline)
    assert config["lr"] == 0.1 and config["model"] == "mlp" and config["shape"] == "(3, 4)"


def test_through_fit_the_run_id_is_checkpointed(offline):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = functrain.optim.sgd(lr=0.1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]

    def loss_fn(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]), batch[1])

    logger = WandBLogger(project="fit", dir=offline)
    state = functrain.init(model, opt)
    step = functrain.make_step(model, loss_fn, opt)
    functrain.fit(step, state, data, duration="4ba", loggers=[logger], log_interval="1ba")
    rows = settled_history(offline, expected_rows=4)[logger.run_id]
    assert [r["_step"] for r in rows if any(k.endswith("loss") for k in r)] == [1, 2, 3, 4]
    assert logger._run is None  # finished at FIT_END


def test_missing_wandb_names_the_install_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"\.\[wandb\]"):
        WandBLogger(project="x").log_metrics({"loss": 1.0}, step=1)
