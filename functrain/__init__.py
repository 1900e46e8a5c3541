"""functrain: a functional PyTorch trainer.

Training is an explicit, pure `(state, batch) -> (state, metrics)` step; speedup algorithms are
transforms of that step; the state is a pytree that checkpoints leaf by leaf.

Example:
    >>> state = functrain.init(model, functrain.optim.adamw(lr=1e-3), seed=0)
    >>> step = functrain.make_step(model, loss_fn, functrain.optim.adamw(lr=1e-3))
    >>> state, metrics = step(state, batch)
"""

from . import (
    algorithms,
    callbacks,
    checkpoint,
    dist,
    functional,
    loggers,
    models,
    optim,
    recipes,
    rng,
    schedules,
    tree,
)
from .algorithms import apply_surgery
from .compile import CompiledStep, compile_step
from .export import export
from .rng import RngState, key_for
from .state import TrainState, init
from .step import Algorithm, GradResult, Step, StepPieces, compose, make_step
from .time import Time, Timestamp, TimeUnit

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "CompiledStep",
    "GradResult",
    "RngState",
    "Step",
    "StepPieces",
    "Time",
    "TimeUnit",
    "Timestamp",
    "TrainState",
    "algorithms",
    "apply_surgery",
    "callbacks",
    "checkpoint",
    "compile_step",
    "compose",
    "dist",
    "export",
    "functional",
    "init",
    "key_for",
    "loggers",
    "make_step",
    "models",
    "optim",
    "recipes",
    "rng",
    "schedules",
    "tree",
]
