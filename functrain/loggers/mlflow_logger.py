"""`MLflowLogger`: metrics, parameters and images in an MLflow tracking store.

Works with any tracking URI (a server, a database, or a local `file://` store) through
`mlflow.tracking.MlflowClient`, without touching mlflow's global "active run". The run id is part
of the logger's `state_dict`, so a resumed training run keeps logging into the same MLflow run.

Example:
    >>> logger = MLflowLogger("file:///tmp/mlruns", experiment_name="digits")
    >>> logger.log_metrics({"loss": torch.tensor(0.25)}, step=10)
    >>> logger.close()
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from .base import Logger, import_optional

# mlflow accepts alphanumerics, "_", "-", ".", " ", ":" and "/" in keys.
_BAD_KEY_CHARS = re.compile(r"[^0-9A-Za-z_\-. :/]")
_MAX_METRICS_PER_CALL = 1000  # mlflow's limit per log_batch request
_MAX_PARAMS_PER_CALL = 100
_MAX_PARAM_CHARS = 6000


def mlflow_key(key: str) -> str:
    """`key` with characters mlflow rejects replaced by "_"."""
    return _BAD_KEY_CHARS.sub("_", key)


class MLflowLogger(Logger):
    """Log to MLflow.

    Args:
        tracking_uri: where runs are stored ("http://host:5000", "sqlite:///mlflow.db",
            "file:///path/mlruns", ...); None uses mlflow's default (`MLFLOW_TRACKING_URI`).
            mlflow >= 3 accepts a plain directory store only with the environment variable
            `MLFLOW_ALLOW_FILE_STORE=true`.
        experiment_name: created if it does not exist.
        run_name: the run's display name.
        run_id: log into this existing run instead of starting a new one.
        tags: tags set on a new run.
        all_ranks: log on every rank (each rank starts its own run).
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str = "functrain",
        *,
        run_name: str | None = None,
        run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        all_ranks: bool = False,
    ):
        super().__init__(all_ranks=all_ranks)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.run_id = run_id
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        self._client = None

    @property
    def client(self):
        """The `MlflowClient`, created on first use."""
        if self._client is None:
            tracking = import_optional(  # mlflow is an optional dependency
                "mlflow.tracking",
                "MLflowLogger needs mlflow: pip install mlflow-skinny (or mlflow)",
            )
            self._client = tracking.MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _run(self) -> str:
        """The run id, starting the run (and the experiment) on first use."""
        if self.run_id is None:
            experiment = self.client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                experiment_id = self.client.create_experiment(self.experiment_name)
            else:
                experiment_id = experiment.experiment_id
            tags = dict(self.tags)
            if self.all_ranks:
                tags["rank"] = str(self.rank)
            run = self.client.create_run(experiment_id, run_name=self.run_name, tags=tags)
            self.run_id = run.info.run_id
        return self.run_id

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), v, now, step) for k, v in values.items()]
        run_id = self._run()
        for start in range(0, len(metrics), _MAX_METRICS_PER_CALL):
            self.client.log_batch(run_id, metrics=metrics[start : start + _MAX_METRICS_PER_CALL])

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [
            Param(mlflow_key(k), (v if isinstance(v, str) else repr(v))[:_MAX_PARAM_CHARS])
            for k, v in hparams.items()
        ]
        run_id = self._run()
        for start in range(0, len(params), _MAX_PARAMS_PER_CALL):
            self.client.log_batch(run_id, params=params[start : start + _MAX_PARAMS_PER_CALL])

    def write_images(self, name: str, images: np.ndarray, step: int) -> None:
        run_id = self._run()
        for index, image in enumerate(images):
            image = image[..., 0] if image.shape[-1] == 1 else image
            suffix = f"_{index}" if len(images) > 1 else ""
            artifact = f"images/{mlflow_key(name).replace('/', '_')}_step{step:08d}{suffix}.png"
            self.client.log_image(run_id, image, artifact_file=artifact)

    def state_dict(self) -> dict[str, Any]:
        """The run id, so that a resumed training run logs into the same MLflow run."""
        return {"run_id": self.run_id or ""}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("run_id"):
            self.run_id = str(state["run_id"])

    def fit_end(self, ctx: Any) -> None:
        self.close()  # marks the run FINISHED; logging again (a later fit call) still works

    def close(self) -> None:
        if self._client is not None and self.run_id is not None and self.active:
            self.client.set_terminated(self.run_id, "FINISHED")
        self._client = None
