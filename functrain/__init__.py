"""functrain: a functional PyTorch trainer.

Training is an explicit, pure `(state, batch) -> (state, metrics)` step; speedup algorithms are
transforms of that step; the state is a pytree that checkpoints leaf by leaf.

Example:
    >>> state = functrain.init(model, functrain.optim.adamw(lr=1e-3), seed=0)
    >>> step = functrain.make_step(model, loss_fn, functrain.optim.adamw(lr=1e-3))
    >>> state, metrics = step(state, batch)
"""

from typing import TYPE_CHECKING

from . import (
    algorithms,
    callbacks,
    checkpoint,
    data,
    functional,
    loggers,
    loop,
    metrics,
    models,
    optim,
    parallel,
    recipes,
    rng,
    schedules,
    tree,
)
from .algorithms import apply_surgery
from .export import export
from .loop import StepError, evaluate, events, fit, predict
from .loop.events import CallbackError, Context, Event
from .loop.fit_state import FitState
from .loop.lr_find import LRFindResult, lr_find
from .loop.options import FitOptions, FitResult
from .rng import RngState, key_for
from .state import TrainState, init
from .step import Algorithm, GradResult, Step, StepPieces, compose, make_step
from .step.compile import CompiledStep, compile_step
from .step.protocol import Evaluator, StepLike, as_step
from .units import Time, Timestamp, TimeUnit

if TYPE_CHECKING:
    from .ensemble import stack_states, unstack_states

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "CallbackError",
    "CompiledStep",
    "Context",
    "Evaluator",
    "Event",
    "FitOptions",
    "FitResult",
    "FitState",
    "GradResult",
    "LRFindResult",
    "RngState",
    "Step",
    "StepError",
    "StepLike",
    "StepPieces",
    "Time",
    "TimeUnit",
    "Timestamp",
    "TrainState",
    "algorithms",
    "apply_surgery",
    "as_step",
    "callbacks",
    "checkpoint",
    "compile_step",
    "compose",
    "data",
    "parallel",
    "evaluate",
    "events",
    "export",
    "fit",
    "functional",
    "init",
    "key_for",
    "loggers",
    "loop",
    "lr_find",
    "make_step",
    "metrics",
    "models",
    "optim",
    "predict",
    "recipes",
    "rng",
    "schedules",
    "stack_states",
    "testing",
    "tree",
    "unstack_states",
]


_ENSEMBLE = ("stack_states", "unstack_states")


def __getattr__(name: str):
    # `functrain.testing` needs hypothesis, a test dependency: imported when first read, so
    # `import functrain` works without it.
    import importlib

    if name == "testing":
        return importlib.import_module(".testing", __name__)
    if name in _ENSEMBLE:  # stacking states for torch.func.vmap: read when first used
        return getattr(importlib.import_module(".ensemble", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"testing", *_ENSEMBLE})
