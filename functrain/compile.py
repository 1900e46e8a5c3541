"""`compile_step`: the whole step, optimizer included, under `torch.compile`.

Compiling the model alone leaves the optimizer's many small kernels in eager mode; compiling the
step puts forward, backward and the update into one graph, so the optimizer's element-wise work
fuses too. The host-side parts stay outside the graph: seeding the global generator from the
step's key, initialising algorithm state, and the data-side `prepare` piece.

Example:
    >>> fast = compile_step(make_step(model, loss_fn, optimizer))
    >>> state, metrics = fast(state, batch)    # first call compiles (tens of seconds on CPU)
"""

from __future__ import annotations

from typing import Any

import torch

from .dist import compute as dist_compute
from .rng import seed_for, seeded_global_rng
from .state import TrainState
from .step import Step


class CompiledStep:
    """A `Step` whose gradient and update run as one compiled graph.

    Attributes:
        step: the eager step it was made from (with `grad_mode="func"`).
    """

    def __init__(self, step: Step, **compile_options: Any):
        if not isinstance(step, Step):
            raise TypeError(f"compile_step takes a Step from make_step, got {type(step).__name__}")
        if step.config.microbatch_size == "auto":
            raise ValueError("compile_step needs a fixed microbatch_size, not 'auto'")
        self.step = step.with_options(grad_mode="func")
        self.pieces = self.step.pieces
        self._compiled = torch.compile(self._core, **compile_options)

    def with_options(self, **changes) -> CompiledStep:
        """The same compiled step with some `StepConfig` options changed."""
        return CompiledStep(self.step.with_options(**changes))

    def _core(self, state: TrainState, batch: Any):
        return Step.__call__(self.step, state, batch)

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        state = self.step.init_algorithms(state)
        rank, _ = dist_compute.data_parallel_info()
        seed = seed_for(state.rng, state.step, "forward", rank * 65536)
        with seeded_global_rng(seed, self.step._device_type):
            return self._compiled(state, batch)


def compile_step(step: Step, **compile_options: Any) -> CompiledStep:
    """Compile `step` whole (forward, backward and optimizer) with `torch.compile`.

    Args:
        step: a `Step` from `make_step` (or `compose`).
        **compile_options: passed to `torch.compile` (`mode`, `dynamic`, `fullgraph`, ...).
    Returns:
        a `CompiledStep`, called like the step: `state, metrics = compiled(state, batch)`.
        It matches the eager step within float tolerance.
    """
    return CompiledStep(step, **compile_options)
