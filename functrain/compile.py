"""`compile_step`: the whole step, optimizer included, under `torch.compile`.

Compiling the model alone leaves the optimizer's many small kernels in eager mode; compiling the
step puts forward, backward and the update into one graph, so the optimizer's element-wise work
fuses too. The host-side parts stay outside the graph: seeding the global generator from the
step's key, initialising algorithm state, the data-side `prepare` piece, the step's per-structure
plan (`Step.plan_for`: the optimizer-state check, the learning-rate lookup) and reading the "lr"
metric. A guard (fp16 loss scaling, `skip_nonfinite`) decides on the host, so it splits the graph
in two at that point.

`CompiledStep` implements `functrain.StepLike` like the step it was made from.

Example:
    >>> fast = compile_step(make_step(model, loss_fn, optimizer))
    >>> state, metrics = fast(state, batch)    # first call compiles (tens of seconds on CPU)
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch._dynamo

from .parallel import data_parallel_info
from .parallel import running as parallel_running
from .rng import seed_for, seeded_global_rng
from .state import TrainState
from .step import Step
from .step_protocol import Evaluator


class CompiledStep:
    """A `Step` whose gradient and update run as one compiled graph.

    Attributes:
        step: the eager step it was made from.
    """

    def __init__(self, step: Step, **compile_options: Any):
        if not isinstance(step, Step):
            raise TypeError(f"compile_step takes a Step from make_step, got {type(step).__name__}")
        if step.config.microbatch_size == "auto":
            raise ValueError("compile_step needs a fixed microbatch_size, not 'auto'")
        self.step = step
        self.pieces = step.pieces
        self.compile_options = dict(compile_options)
        # The compiled core is the step minus `prepare`: data-side transforms draw their random
        # choices on the host (keys from hashing), which would break the graph.
        self._core_step = copy.copy(step)
        self._core_step.pieces = step.pieces._replace(prepare=lambda state, batch: batch)
        self._compiled = torch.compile(self._core, **compile_options)

    def with_options(self, **changes) -> CompiledStep:
        """The same compiled step with some `StepConfig` options changed."""
        return CompiledStep(self.step.with_options(**changes), **self.compile_options)

    def donated(self) -> CompiledStep:
        """This compiled step allowed to update its input state in place."""
        return self if self.step.config.donate else self.with_options(donate=True)

    def init_state(self, state: TrainState) -> TrainState:
        """`state` with what the step keeps in it (see `Step.init_state`)."""
        return self.step.init_state(state)

    def evaluator(self) -> Evaluator:
        """How evaluation runs the model (eagerly, as the step it was made from)."""
        return self.step.evaluator()

    def _core(self, state: TrainState, batch: Any, plan: Any):
        return Step._fold(self._core_step, plan, state, batch)

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        if not isinstance(state, TrainState):
            raise TypeError(
                f"a step takes (TrainState, batch); got {type(state).__name__} as the state "
                "(build one with functrain.init(model, optimizer))"
            )
        state = self.step.init_state(state)
        plan = self._core_step.plan_for(state)
        batch = self.pieces.prepare(state, batch)
        rank, _ = data_parallel_info(state.layout)
        seed = seed_for(state.rng, state.step, "forward", rank * 65536)
        # trace_autograd_ops lets dynamo trace `torch.autograd.grad` into the graph, so the
        # default ("autograd") gradients compile whole, BatchNorm's in-place statistics included
        # (torch.func.grad rejects those in-place updates).
        with (
            seeded_global_rng(seed, self.step._device_type),
            torch._dynamo.config.patch(trace_autograd_ops=True),
            # the layout's input cast and TP forwards, installed outside the graph
            parallel_running(self.step.model, state.layout),
        ):
            new_state, metrics = self._compiled(state, batch, plan)
        self._core_step._plans.produced(new_state.opt_state, plan)
        metrics["lr"] = plan.read_lr(new_state.opt_state)
        return new_state, metrics


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
