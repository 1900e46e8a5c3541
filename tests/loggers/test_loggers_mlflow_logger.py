"""MLflowLogger: metrics, params and images in a local file store; resume keeps the run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from functrain.loggers import MLflowLogger
from functrain.loggers.mlflow_logger import mlflow_key

pytest.importorskip("mlflow")


def test_metrics_params_images_and_resume(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    # mlflow 3 keeps its file store behind an opt-in; a local directory is all a test needs.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLogger(uri, experiment_name="digits", run_name="first")
    logger.log_hparams({"lr": 0.1, "model": "mlp"})
    for step in (1, 2):
        logger.log_metrics({"train/loss": torch.tensor(1.0 / step), "grad@norm": 2.0}, step=step)
    logger.log_images("images/train", np.full((6, 8, 3), 200, dtype=np.uint8), step=2)
    saved = logger.state_dict()
    logger.close()

    resumed = MLflowLogger(uri, experiment_name="digits")
    resumed.load_state_dict(saved)
    resumed.log_metrics({"train/loss": 0.25}, step=4)
    resumed.close()

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(saved["run_id"])
    assert run.data.params == {"lr": "0.1", "model": "mlp"}
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.5), (4, 0.25)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "grad_norm")] == [2.0] * 2
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "images")]
    assert artifacts == ["images/images_train_step00000002.png"]
    experiment = client.get_experiment_by_name("digits")
    assert len(client.search_runs([experiment.experiment_id])) == 1  # resumed into the same run


def test_keys_are_sanitised():
    assert mlflow_key("l2_norm/grad/layers.0 (attn)@x") == "l2_norm/grad/layers.0 _attn__x"
