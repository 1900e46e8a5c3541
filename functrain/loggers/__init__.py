"""Loggers: where metrics go (console, progress bar, JSONL, CSV, TensorBoard, MLflow, W&B).

A logger is a callback that also has `log_metrics(metrics, step)` (and optionally `log_hparams`,
`log_images`, `close`). Loggers write on rank 0 only unless built with `all_ranks=True`, and turn
device tensors into floats only on the steps the loop logs.

Example:
    >>> functrain.fit(step, state, loader, duration="2ep",
    ...               loggers=[ConsoleLogger(), JSONLLogger(), ProgressBar()])  # doctest: +SKIP
"""

from .base import Logger, as_uint8_nhwc, process_rank, to_floats
from .console import ConsoleLogger
from .csv_logger import CSVLogger
from .jsonl import JSONLLogger, read_metrics
from .mlflow_logger import MLflowLogger
from .progress_bar import ProgressBar
from .tensorboard_logger import TensorBoardLogger
from .wandb_logger import WandBLogger

__all__ = [
    "CSVLogger",
    "ConsoleLogger",
    "JSONLLogger",
    "Logger",
    "MLflowLogger",
    "ProgressBar",
    "TensorBoardLogger",
    "WandBLogger",
    "as_uint8_nhwc",
    "process_rank",
    "read_metrics",
    "to_floats",
]
