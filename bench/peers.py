"""Peer trainers for the overhead suites: MosaicML Composer and PyTorch Lightning, when installed.

They are optional and live in a separate environment (see bench/README.md and
bench/requirements-peers.txt), so the project never depends on them. `missing(name)` says why one
cannot run; the suites then skip it and say so.

Each peer trains the benchmark model with `torch.optim.AdamW(fused=True)` (the faster of torch's
two CPU AdamW kernels, so the peer is not charged for a slow optimizer) on the same batches and
loss as every other variant. Its `Trainer.fit` is called once per timed block; the clock is read
in the trainer's own after-the-step hook, so fit's setup and teardown are not counted, only whole
training-loop iterations. Peer output (progress bars, info lines, warnings) goes to /dev/null
while they run.

Composer 0.32 needs torchvision, whose PyPI wheels are CUDA builds: beside the CPU torch their
C++ ops fail to load and `import torchvision` raises "operator torchvision::nms does not exist".
`import_torchvision` defines the two op schemas torchvision registers fake kernels for (`nms`,
`qnms`) and imports it again; Composer never calls those ops here.

Example:
    >>> if not missing("lightning"):
    ...     runner = lightning_runner(spec, data, torch.device("cpu"), defaults=False, lr=1e-3,
    ...                               weight_decay=1e-2)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from typing import Any

import torch

from . import common

INSTALL_HINT = "install the peers with the command in bench/README.md"
PACKAGES = {"composer": "composer", "lightning": "lightning"}


def import_torchvision() -> Any:
    """Import torchvision, defining its missing op schemas when its C++ ops fail to load."""
    try:
        import torchvision
    except RuntimeError as error:
        if "torchvision::" not in str(error) or "does not exist" not in str(error):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the failed, half-initialised import
        library = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 (kept alive below)
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARIES.append(library)
        import torchvision
    return torchvision


_LIBRARIES: list = []  # a torch.library.Library un-registers its definitions when collected
_MISSING: dict[str, str | None] = {}


def missing(name: str) -> str | None:
    """Why peer `name` ("composer" or "lightning") cannot be imported, or None if it can."""
    if name not in PACKAGES:
        raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PACKAGES)}")
    if name in _MISSING:
        return _MISSING[name]
    module = PACKAGES[name]
    reason = None
    if importlib.util.find_spec(module) is None:
        reason = f"{module} is not installed; {INSTALL_HINT}"
    else:
        try:
            with _quiet():
                if name == "composer":
                    import_torchvision()
                importlib.import_module(module)
        except Exception as error:  # any import failure means: skip this peer, and say why
            reason = f"import {module} failed ({type(error).__name__}: {error}); {INSTALL_HINT}"
    _MISSING[name] = reason
    return reason


def versions() -> dict[str, str | None]:
    """The installed peers' versions (None when missing)."""
    found = {}
    for name, module in PACKAGES.items():
        found[name] = None if missing(name) else getattr(sys.modules[module], "__version__", "?")
    return found


@contextlib.contextmanager
def _quiet():
    """Send stdout, stderr (file descriptors too, for tqdm and C++ logs) and warnings to null."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def _adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)


def composer_runner(spec, data, device, now, *, defaults: bool, lr: float, weight_decay: float):
    """A `Runner` training `spec` with Composer's `Trainer`; `defaults=False` turns output off.

    Args:
        spec: the `bench.overhead.ModelSpec` (its `build` and `criterion` are used).
        data: the batches (an indexable epoch with a `batch_size`, which Composer reads).
        device: where to train.
        now: the clock read after every step (in the trainer's `batch_end` event).
        defaults: keep the Trainer's defaults instead of turning output off.
        lr, weight_decay: AdamW's hyperparameters.

    The quiet variant sets `progress_bar=False, log_to_console=False, loggers=[]`; the defaults
    variant passes none of these (Composer's progress bar on, console logging off by default).
    """
    from composer import Trainer
    from composer.core import Callback
    from composer.models import ComposerModel

    class Wrapped(ComposerModel):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, batch):
            return self.model(batch[0])

        def loss(self, outputs, batch):
            return spec.criterion(outputs, batch[1])

    class Tick(Callback):
        def __init__(self):
            super().__init__()
            self.stamps: list[float] = []

        def batch_end(self, state, logger):
            self.stamps.append(now())

    tick = Tick()
    model = spec.build().to(device)
    options: dict[str, Any] = {}
    if not defaults:
        options = {"progress_bar": False, "log_to_console": False, "loggers": []}
    with _quiet():
        trainer = Trainer(
            model=Wrapped(model),
            train_dataloader=data,
            optimizers=_adamw(model.parameters(), lr, weight_decay),
            device="gpu" if device.type == "cuda" else "cpu",
            callbacks=[tick],
            seed=0,
            **options,
        )

    def run(n):
        tick.stamps = []
        with _quiet():
            trainer.fit(duration=f"{n}ba")
        return tick.stamps

    def close():
        with _quiet():
            trainer.close()

    return common.Runner("", run, close)


def lightning_runner(spec, data, device, now, *, defaults: bool, lr: float, weight_decay: float):
    """A `Runner` training `spec` with Lightning's `Trainer`; `defaults=False` turns output off.

    Args: as `composer_runner` (the clock is read in `on_train_batch_end`).

    The quiet variant sets `logger=False, enable_progress_bar=False, enable_model_summary=False,
    enable_checkpointing=False`; the defaults variant keeps Lightning's defaults (progress bar,
    TensorBoard or CSV logger, model summary, checkpoint at the end of fit) in a temporary
    directory. A fresh `Trainer` runs each block; the module hands every one the same optimizer,
    so its state carries on as in one long run.
    """
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.optimizer = None

        def training_step(self, batch, batch_idx):
            return spec.criterion(self.model(batch[0]), batch[1])

        def configure_optimizers(self):
            if self.optimizer is None:
                self.optimizer = _adamw(self.parameters(), lr, weight_decay)
            return self.optimizer

    class Tick(lightning.Callback):
        def __init__(self):
            super().__init__()
            self.stamps: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.stamps.append(now())

    tick = Tick()
    module = Module(spec.build().to(device))
    root = tempfile.mkdtemp(prefix="bench-lightning-")
    options: dict[str, Any] = {"default_root_dir": root}
    if not defaults:
        options.update(
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )

    def run(n):
        tick.stamps = []
        with _quiet():
            trainer = lightning.Trainer(
                max_steps=n,
                accelerator="gpu" if device.type == "cuda" else "cpu",
                devices=1,
                callbacks=[tick],
                num_sanity_val_steps=0,
                **options,
            )
            trainer.fit(module, train_dataloaders=data)
        return tick.stamps

    def close():
        shutil.rmtree(root, ignore_errors=True)

    return common.Runner("", run, close)
