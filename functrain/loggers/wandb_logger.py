"""`WandBLogger`: metrics, hyperparameters and images in Weights & Biases (Composer's `WandBLogger`).

The run is started on first use with `wandb.init(..., reinit="create_new")` and the returned `Run`
is the only handle used (never `wandb.run`, the module's global current run), so two loggers in
one process do not mix. The run id is part of the logger's `state_dict`: a resumed training run
logs into the same W&B run (`resume="allow"`). `mode="offline"` (or `WANDB_MODE=offline`) writes
the run under `dir` for a later `wandb sync`, with no network.

Install: `pip install -e ".[wandb]"` (or `pip install wandb`).

Example:
    >>> logger = WandBLogger(project="digits", mode="offline", dir="runs/digits")
    >>> functrain.fit(step, state, loader, duration="2ep", loggers=[logger])  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .base import Logger, import_optional

INSTALL_HINT = 'WandBLogger needs wandb: pip install -e ".[wandb]" (or pip install wandb)'


class WandBLogger(Logger):
    """Log to Weights & Biases.

    Args:
        project: the W&B project.
        entity: the team or user (None: the default of the API key).
        name: the run's display name.
        group: a group of runs (e.g. the ranks of one job with `all_ranks=True`).
        tags: tags of a new run.
        run_id: log into this run (also what `load_state_dict` restores).
        mode: "online", "offline" or "disabled" (None: `WANDB_MODE`, else online).
        dir: where wandb writes its files (None: the current directory).
        init_kwargs: more arguments for `wandb.init`.
        all_ranks: log on every rank (each rank starts its own run).
    """

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        *,
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        run_id: str | None = None,
        mode: str | None = None,
        dir: str | os.PathLike | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
        all_ranks: bool = False,
    ):
        super().__init__(all_ranks=all_ranks)
        self.project, self.entity, self.name, self.group = project, entity, name, group
        self.tags = list(tags or [])
        self.run_id = run_id
        self.mode = mode
        self.dir = os.fspath(dir) if dir is not None else None
        self.init_kwargs = dict(init_kwargs or {})
        self._run = None
        self._pending_config: dict[str, Any] = {}

    @property
    def run(self) -> Any:
        """The `wandb` Run, started on first use (and resumed when `run_id` is set)."""
        if self._run is None:
            wandb = import_optional("wandb", INSTALL_HINT)
            if self.dir is not None:
                os.makedirs(self.dir, exist_ok=True)
            name = self.name
            if self.all_ranks and name is not None:
                name = f"{name}-rank{self.rank}"
            self._run = wandb.init(
                project=self.project,
                entity=self.entity,
                name=name,
                group=self.group,
                tags=self.tags or None,
                id=self.run_id,
                resume="allow" if self.run_id else None,
                mode=self.mode,
                dir=self.dir,
                config=self._pending_config or None,
                reinit="create_new",  # a Run of its own, never the module's current run
                **self.init_kwargs,
            )
            self.run_id = self._run.id
            self._pending_config = {}
        return self._run

    def write_metrics(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def write_hparams(self, hparams: dict[str, Any]) -> None:
        plain = {
            k: v if isinstance(v, (str, int, float, bool)) else repr(v) for k, v in hparams.items()
        }
        if self._run is None:
            self._pending_config.update(plain)  # given to wandb.init with the run
        else:
            self._run.config.update(plain, allow_val_change=True)

    def write_images(self, name: str, images: np.ndarray, step: int) -> None:
        wandb = import_optional("wandb", INSTALL_HINT)
        pictures = [
            wandb.Image(image[..., 0] if image.shape[-1] == 1 else image) for image in images
        ]
        self.run.log({name: pictures}, step=step)

    def state_dict(self) -> dict[str, Any]:
        """The run id, so that a resumed training run logs into the same W&B run."""
        return {"run_id": self.run_id or ""}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("run_id") and self._run is None:
            self.run_id = str(state["run_id"])

    def fit_end(self, ctx: Any) -> None:
        self.close()  # finishes the run; logging again (a later fit call) resumes it

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
