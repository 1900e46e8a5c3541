"""Callbacks: observers of the training loop (monitors, stoppers, visualisers, the profiler).

A callback is any object with methods named after the loop's events in lower case
(`def batch_end(self, ctx)`); it reads `ctx.state` and `ctx.metrics`, logs with `ctx.log(...)`
and may ask the loop to stop with `ctx.request_stop(reason)`, but never changes the state. State
that matters for resume is returned by `state_dict()` as plain values.

Example:
    >>> functrain.fit(step, state, loader, duration="10ep", eval_data=val,
    ...               callbacks=[LRMonitor(), SpeedMonitor(), EarlyStopper("accuracy")])  # doctest: +SKIP
"""

from .activation_monitor import ActivationMonitor
from .early_stopper import EarlyStopper
from .image_visualizer import ImageVisualizer, render_grid
from .interval import Interval, LogCadence, Trigger
from .lr_monitor import LRMonitor, learning_rates
from .memory_monitor import MemoryMonitor, cuda_memory, process_memory
from .model_summary import ModelSummary
from .nan_monitor import NaNMonitor, NonFiniteError
from .optimizer_monitor import OptimizerMonitor, group_norms, group_of
from .runtime_estimator import RuntimeEstimator
from .speed_monitor import SpeedMonitor, device_peak_flops
from .threshold_stopper import ThresholdStopper
from .torch_profiler import TorchProfiler

__all__ = [
    "ActivationMonitor",
    "EarlyStopper",
    "ImageVisualizer",
    "Interval",
    "LRMonitor",
    "LogCadence",
    "MemoryMonitor",
    "ModelSummary",
    "NaNMonitor",
    "NonFiniteError",
    "OptimizerMonitor",
    "RuntimeEstimator",
    "SpeedMonitor",
    "ThresholdStopper",
    "TorchProfiler",
    "Trigger",
    "cuda_memory",
    "device_peak_flops",
    "group_norms",
    "group_of",
    "learning_rates",
    "process_memory",
    "render_grid",
]
