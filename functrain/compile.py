"""`compile_step`: the step with its forward and backward passes compiled by `torch.compile`.

What is compiled is the step's `grads` piece: forward, loss and `torch.autograd.grad` in one
graph (with BatchNorm's in-place statistics), so the backward pass fuses with the forward. The
rest of the step runs as in the eager step, around it:

- the optimizer update stays the fused executor (`functrain.optim.fused`): on the CPU torch's
  fused AdamW kernel is over twice as fast as what inductor generates from the same arithmetic
  (measured: `python -m bench update`), and a graph of the update would need the step and
  optimizer counts as graph inputs;
- the host-side parts (seeding the global generator from the step's key, algorithm state, the
  data-side `prepare` piece, the counters) stay in Python.

So the compiled graph takes only tensors (parameters, buffers, the batch, the fp16 loss scale):
no Python int or float of the state, which change every step, reaches a guard, and the step
compiles **once** for a run (again only for a new batch shape, e.g. a short last batch, or an
algorithm that reads the step count inside the gradient piece, such as SAM's interval).

Example:
    >>> fast = compile_step(make_step(model, loss_fn, optimizer))
    >>> state, metrics = fast(state, batch)    # the first call compiles
"""

from __future__ import annotations

import copy
import itertools
import types
from typing import Any

import torch

from .parallel import compute as parallel_compute
from .rng import seed_for, seeded_global_rng
from .state import TrainState
from .step import Step
from .step_protocol import Evaluator


class CompiledStep:
    """A `Step` whose gradient piece (forward, loss, backward) runs as one compiled graph.

    Attributes:
        step: the eager step it was made from.
        pieces: the eager step's pieces (algorithms rewrite these, not the compiled ones).
    """

    def __init__(self, step: Step, **compile_options: Any):
        if not isinstance(step, Step):
            raise TypeError(f"compile_step takes a Step from make_step, got {type(step).__name__}")
        if step.config.microbatch_size == "auto":
            raise ValueError("compile_step needs a fixed microbatch_size, not 'auto'")
        self.step = step
        self.pieces = step.pieces
        self.compile_options = dict(compile_options)
        # Dynamo guards on what the piece reads (tensors, the step's static configuration), never
        # on the state's counters, which it does not read.
        self._grads = step.pieces.grads  # the eager piece the graph is traced from
        self._compiled_grads = torch.compile(_fresh_entry(), **compile_options)
        self._core_step = copy.copy(step)
        self._core_step.pieces = step.pieces._replace(grads=self._run_compiled_grads)

    def _run_compiled_grads(self, pieces, state, batch):
        # trace_autograd_ops lets dynamo trace `torch.autograd.grad` into the graph, so the
        # default ("autograd") gradients compile whole, BatchNorm's in-place statistics included.
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return self._compiled_grads(self._grads, pieces, state, batch)

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

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        rank, _ = parallel_compute.data_parallel_info()
        seed = seed_for(state.rng, state.step, "forward", rank * 65536)
        # The graph does not seed the global generator per microbatch (that is host work):
        # it is seeded once here, from the same key, so dropout is a function of the seed.
        with seeded_global_rng(seed, self.step._device_type):
            return Step.__call__(self._core_step, state, batch)


def _grads_entry(grads, pieces, state, batch):
    return grads(pieces, state, batch)


def _fresh_entry():
    """`_grads_entry` with a code object of its own.

    Dynamo keeps its compiled graphs per code object, up to a recompile limit (8): were every
    compiled step to share one, the ninth model of a process would silently run eagerly.
    """
    code = _grads_entry.__code__.replace(co_name=f"compiled_grads_{next(_COUNTER)}")
    return types.FunctionType(code, _grads_entry.__globals__, code.co_name)


_COUNTER = itertools.count()


def compile_step(step: Step, **compile_options: Any) -> CompiledStep:
    """Compile `step`'s forward and backward passes with `torch.compile`.

    Args:
        step: a `Step` from `make_step` (or `compose`).
        **compile_options: passed to `torch.compile` (`mode`, `dynamic`, `fullgraph`, `backend`).
    Returns:
        a `CompiledStep`, called like the step: `state, metrics = compiled(state, batch)`.
        It matches the eager step within float tolerance, compiles once per batch shape, and
        keeps the eager step's purity (`donate=False` leaves the input state untouched).
    """
    return CompiledStep(step, **compile_options)
