"""functrain: a functional PyTorch trainer (provisional init while modules land)."""

from . import rng, tree
from .rng import RngState, key_for
from .state import TrainState, init
from .time import Time, Timestamp, TimeUnit

try:  # provisional: the optimizer package lands in parallel
    from . import optim
    from .step import Algorithm, GradResult, Step, StepPieces, compose, make_step
    from .compile import CompiledStep, compile_step
except ImportError:  # pragma: no cover
    pass

__version__ = "0.1.0"
