"""`compile_step`: the step with its forward pass and loss compiled by `torch.compile`.

What is compiled is the step's `loss` piece: the model's forward and the loss (with whatever
algorithms put there, such as label smoothing), exactly the region `torch.compile(model)`
covers, plus the loss. AOTAutograd compiles its backward pass too, so forward and backward both
run as inductor kernels. The rest of the step runs as in the eager step, around it:

- the optimizer update stays the fused executor (`functrain.optim.fused`): on the CPU torch's
  fused AdamW kernel is over twice as fast as what inductor generates from the same arithmetic,
  and compiling the update would need the step and optimizer counts as graph inputs;
- tracing `torch.autograd.grad` into the graph as well (one joint graph) was measured slower
  than AOTAutograd's forward and backward graphs (the CNN of `python -m bench overhead`: 0.76x
  of the floor against 0.60x), and compiled for longer;
- the host-side parts (seeding the global generator from the step's key, algorithm state, the
  data-side `prepare` piece, the counters, microbatching) stay in Python.

So the compiled graph never sees the state: the loss piece takes `(model, batch)`. No Python
int or float that changes every step reaches a guard, and the step compiles **once** for a run
(again only for a new batch shape, e.g. a short last batch or microbatch).

Under a layout, what the forward run installs (`step.forward_run.ORDER`) is installed around
the compiled region, as in the eager step, and traced where dynamo can:

- tensor parallelism: the parallel forwards and their collectives are traced (also inside a
  checkpointed block): one graph, equal to the eager step; the traced collectives are not
  counted in `parallel.COUNTER`, and q, k and v reading one input each all-reduce their own
  input gradient (equal up to rounding; see `parallel.tensor_parallel`);
- gather at use (`fsdp(reshard_after_forward=True)`): the module hooks and the gathers are
  not traceable; dynamo breaks the graph around them and retraces modules on later steps (the
  hooks are registered anew for every forward), so such a step runs largely eagerly, with
  the eager step's results. A checkpointed block there runs torch's checkpoint eagerly.

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

from ..state import TrainState
from . import Step
from .protocol import Evaluator


class CompiledStep:
    """A `Step` whose loss piece (forward and loss; backward by AOTAutograd) is compiled.

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
        loss = step.pieces.loss
        compiled = torch.compile(_fresh_entry(), **compile_options)
        self._core_step = copy.copy(step)
        self._core_step.pieces = step.pieces._replace(
            loss=lambda model, batch: compiled(loss, model, batch)
        )

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
        return Step.__call__(self._core_step, state, batch)


def _loss_entry(loss, model, batch):
    return loss(model, batch)


def _fresh_entry():
    """`_loss_entry` with a code object of its own.

    Dynamo keeps its compiled graphs per code object, up to a recompile limit (8): were every
    compiled step to share one, the ninth model of a process would silently run eagerly.
    """
    code = _loss_entry.__code__.replace(co_name=f"compiled_loss_{next(_COUNTER)}")
    return types.FunctionType(code, _loss_entry.__globals__, code.co_name)


_COUNTER = itertools.count()


def compile_step(step: Step, **compile_options: Any) -> CompiledStep:
    """Compile `step`'s forward pass and loss (and so its backward pass) with `torch.compile`.

    Args:
        step: a `Step` from `make_step` (or `compose`).
        **compile_options: passed to `torch.compile` (`mode`, `dynamic`, `fullgraph`, `backend`).
    Returns:
        a `CompiledStep`, called like the step: `state, metrics = compiled(state, batch)`.
        It matches the eager step within float tolerance, compiles once per batch shape, and
        keeps the eager step's purity (`donate=False` leaves the input state untouched).
    """
    return CompiledStep(step, **compile_options)
