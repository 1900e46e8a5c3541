"""The training step: `(state, batch) -> (state, metrics)`, a fold over small named pieces.

`make_step(model, loss_fn, optimizer)` returns a `Step`. Calling it runs its pieces in order:

    prepare(state, batch)                 -> batch        the data side (MixUp, resizing, ...)
    grads(pieces, state, batch)           -> GradResult   forward + loss + gradients, microbatched;
                                                          calls pieces.loss(model, batch)
    transform_grads(grads, state)         -> grads        clipping, SAM's correction, ...
    guard(result, grad_norm, state)       -> state, skip  fp16 loss scale, skip_nonfinite
    update(grads, state)                  -> state        optimizer + apply_updates (not on a skip)
    after_update(state)                   -> state        EMA, SWA, ...

and returns the state with `step` and the timestamp advanced, and the metrics. The pieces live in
a `StepPieces` record on the step (`step.pieces`). A speedup algorithm is an `Algorithm` whose
`apply` rewrites some pieces and leaves the others alone, so `compose(step, label_smoothing(0.1),
ema())` is ordinary function composition. The step's own options are algorithms too, composed
first: `precision="amp_fp16"` is `functrain.step.precision.loss_scaling()`, `skip_nonfinite=True` is
`functrain.step.guards.skip_nonfinite()`.

Purity contract: by default a step never modifies the input state (new tensors are returned, and
BatchNorm statistics are updated on copies). `donate=True` (JAX's `donate_argnums`) lets the step
reuse the input state's memory: parameters and optimizer state are updated in place and the input
state must not be used afterwards. `fit` donates, as the loop owns the state. A step the guard
skips leaves params, buffers and optimizer state exactly as they were, donated or not.

Randomness: modules that draw from torch's global generator (dropout, stochastic depth) run with
that generator seeded from `key_for(state.rng, state.step, "forward", rank)` and restored after, so
a run is a pure function of its seed.

Under `torch.func` transforms (`torch.func.vmap(step, in_dims=(0, None))` over states stacked by
`functrain.stack_states`, see docs/ensembles.md) the step takes its functorch form by itself, no
flag needed: gradients by `torch.func.grad`, no donation, the optimizer's functional update one
op per tensor, metrics as tensors. A guarded step (skip_nonfinite, amp_fp16) refuses to run there.

Decided once: the step checks an optimizer state against the parameters, finds where its learning
rate lives and how to take the gradient norm when it first sees a state it did not produce (see
`functrain.step.plan`); later calls on its own outputs only reuse those decisions.

Example:
    >>> model = torch.nn.Linear(4, 1)
    >>> def loss_fn(model, batch):
    ...     x, y = batch
    ...     return torch.nn.functional.mse_loss(model(x), y)
    >>> opt = functrain.optim.sgd(lr=0.1)
    >>> state = functrain.init(model, opt, seed=0)
    >>> step = make_step(model, loss_fn, opt)
    >>> state, metrics = step(state, (torch.randn(8, 4), torch.randn(8, 1)))
    >>> state.step
    1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch
from ..optim import global_norm
from ..parallel import compute as parallel_compute
from ..parallel import data_parallel_info, norms
from ..state import TrainState
from . import precision as precision_lib
from .batching import num_samples
from .checks import check_config, check_surgery_applied
from .grads import GradsPiece
from .guards import counts_on_device, keep_buffers, run_update, skip_nonfinite
from .pieces import (
    Algorithm,
    Batch,
    GradResult,
    StepConfig,
    StepPieces,
    no_guard,
    normalize_loss,
)
from .plan import Plans, StatePlan
from .protocol import Evaluator
from .update import UpdatePiece

__all__ = ["Algorithm", "GradResult", "Step", "StepPieces", "compose", "make_step"]


class Step:
    """A training step `(state, batch) -> (state, metrics)`; build it with `make_step`.

    Implements `functrain.StepLike` (`donated`, `init_state`, `evaluator`).

    Attributes:
        pieces: the `StepPieces` record.
        model: the skeleton module the params run in.
        config: the `StepConfig`.
        algorithms: the `Algorithm`s composed into it, in order (the step's own, for precision
            and skipping, are not listed: they follow from `config`).
    """

    def __init__(self, model, loss_fn, optimizer, config: StepConfig, algorithms=()):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.config = config
        self.algorithms = tuple(algorithms)
        self._own_algorithms = _own_algorithms(config)
        self._grads_piece = GradsPiece(model, config)
        self._trainable = self._grads_piece.trainable
        self._device_type = self._grads_piece.device_type
        self._plans = Plans()  # performance caches only: what a call decides is the same
        self.update_piece = UpdatePiece(optimizer, config)
        pieces = self._base_pieces()
        for algorithm in self._own_algorithms + self.algorithms:
            pieces = algorithm.apply(pieces)
            if not isinstance(pieces, StepPieces):
                raise TypeError(
                    f"algorithm {algorithm.name!r}: apply must return StepPieces, "
                    f"got {type(pieces).__name__}"
                )
        self.pieces = pieces
        self._guarded = pieces.guard is not no_guard
        self._func_step: Step | None = None  # this step's form under torch.func transforms

    # -- building ----------------------------------------------------------------------------

    def with_options(self, **changes) -> Step:
        """The same step with some `StepConfig` options changed (e.g. `donate=True`)."""
        config = dataclasses.replace(self.config, **changes)
        check_config(config)
        return Step(self.model, self.loss_fn, self.optimizer, config, self.algorithms)

    # -- the StepLike protocol ----------------------------------------------------------------

    def donated(self) -> Step:
        """This step allowed to update its input state in place (`fit` owns its state)."""
        return self if self.config.donate else self.with_options(donate=True)

    def init_state(self, state: TrainState) -> TrainState:
        """`state` with an `algo_state` entry for every composed algorithm that keeps one (the
        fp16 loss scale included) and lacks it; the same object when nothing is missing."""
        # A guarded step keeps its counts as tensors (guards.py): its own outputs have them so.
        if self._own_algorithms and self._plans.own(state.opt_state) is None:
            state = counts_on_device(state)
        algo_state = state.algo_state
        missing = [
            a
            for a in self._own_algorithms + self.algorithms
            if a.init is not None and a.name not in algo_state
        ]
        if not missing:
            return state
        algo_state = dict(algo_state)
        for algorithm in missing:
            if algorithm.name not in algo_state:  # two with one name: the first one's state
                algo_state[algorithm.name] = algorithm.init(state)
        return state.replace(algo_state=algo_state)

    def call_model(self, state: TrainState, *args, **kwargs):
        """Run the model with `state`'s params and buffers, without gradients."""
        return self._grads_piece.call_model(state, *args, **kwargs)

    def evaluator(self) -> Evaluator:
        """How evaluation runs this step's model: the module, `call_model`, the loss."""
        return Evaluator(self.model, self.pieces.call_model, self.loss_fn)

    def _base_pieces(self) -> StepPieces:
        return StepPieces(
            prepare=lambda state, batch: batch,
            loss=lambda model, batch: normalize_loss(self.loss_fn(model, batch)),
            grads=self._grads_piece,
            transform_grads=lambda grads, state: grads,
            update=self.update_piece,
            after_update=lambda state: state,
            call_model=self.call_model,
        )

    # -- the step ----------------------------------------------------------------------------

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        if not isinstance(state, TrainState):
            raise TypeError(
                f"a step takes (TrainState, batch); got {type(state).__name__} as the state "
                "(build one with functrain.init(model, optimizer))"
            )
        if _torch.functorch_transforms_active():
            return self._transformed(state, batch)
        state = self.init_state(state)
        plan = self.plan_for(state)
        new_state, metrics = self._fold(plan, state, batch)
        self._plans.produced(new_state.opt_state, plan)
        metrics["lr"] = plan.read_lr(new_state.opt_state)
        return new_state, metrics

    def _transformed(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        """The step under a `torch.func` transform (see the module docstring)."""
        if self._guarded:
            raise NotImplementedError(
                "this step has a guard (skip_nonfinite or precision='amp_fp16'), whose skip is "
                "one decision for the whole state, not one per vmapped member: it cannot run "
                "under torch.func.vmap/grad; build the step without skip_nonfinite, in fp32 or "
                "amp_bf16, to vmap it"
            )
        if self._func_step is None:  # a performance cache: the same step in its func form
            self._func_step = self.with_options(grad_mode="func", donate=False)
            self._func_step._func_step = self._func_step
        step = self._func_step
        state = step.init_state(state)
        plan = step.plan_for(state)
        new_state, metrics = step._fold(plan, state, batch, transformed=True)
        metrics["lr"] = plan.read_lr(new_state.opt_state)
        metrics = {
            k: torch.tensor(v) if isinstance(v, (bool, int, float)) else v
            for k, v in metrics.items()
        }
        return new_state, metrics

    def plan_for(self, state: TrainState) -> StatePlan:
        """What this step decided for `state`'s structure (checking it when it is new to it).

        Raises:
            ValueError: `state.opt_state` does not fit the trainable parameters.
        """
        return self._plans.plan_for(
            state.opt_state, lambda: {k: state.params[k] for k in self._trainable}, state.layout
        )

    def _fold(
        self, plan: StatePlan, state: TrainState, batch: Batch, transformed: bool = False
    ) -> tuple[TrainState, dict]:
        """The pieces run in order, and the metrics but "lr"; `transformed`: under torch.func."""
        pieces = self.pieces
        batch = pieces.prepare(state, batch)
        _, world = data_parallel_info(state.layout)
        samples = num_samples(batch)
        if samples <= 0:
            raise ValueError("the batch is empty (0 samples): nothing to train on")
        samples *= world
        tokens = int(self.config.count_tokens(batch)) * world if self.config.count_tokens else 0
        # A guarded donating step may have to undo the forward pass's in-place buffer updates.
        saved = None
        if self._guarded and self.config.donate and state.buffers:
            saved = [b.clone() for b in state.buffers.values()]
        result = self._run_grads(pieces, state, batch)
        # Under torch.func transforms: per tensor (no batching rule for foreach kernels).
        plain = plan.plain_grads and not transformed
        grad_norm = _grad_norm(result.grads, plain)
        grads = pieces.transform_grads(result.grads, state)
        # The mean over data-parallel ranks: the metric, and what a guard decides on, so that
        # every rank skips the same steps (a rank-local NaN loss would split them otherwise).
        loss = parallel_compute.mean_over_data_parallel(result.loss, state.layout)
        same = result.buffers is state.buffers
        with_buffers = state if same else state.replace(buffers=result.buffers)
        guarded, skipped = pieces.guard(result._replace(loss=loss), grad_norm, with_buffers)
        device_skip = skipped if isinstance(skipped, torch.Tensor) else None  # see guards.py
        ts = state.timestamp.advance_batch(samples, tokens)
        if device_skip is None and skipped:  # nothing is written: all stays as it was
            if saved is not None:
                _torch.foreach_copy_(list(state.buffers.values()), saved)
            new_state = guarded.replace(buffers=state.buffers, step=state.step + 1, timestamp=ts)
        else:  # on a device decision, the update runs and is kept or discarded there
            norm = grad_norm if grads is result.grads else None  # the default piece takes it
            new_state = run_update(pieces.update, self.update_piece, grads, guarded, norm,
                                   device_skip, self.config.donate, transformed)  # fmt: skip
            if device_skip is not None:  # the buffers of before the forward pass, on a skip
                kept = keep_buffers(device_skip, state.buffers, new_state.buffers, saved)
                new_state = new_state.replace(buffers=kept)
            new_state = new_state.replace(step=state.step + 1, timestamp=ts)
        new_state = pieces.after_update(new_state)
        metrics = {
            k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in result.aux.items()
        }
        metrics.update(loss=loss, grad_norm=grad_norm, samples=samples, tokens=tokens)
        if self._guarded:
            metrics["skipped"] = skipped
        if self.config.report_grad_norms:
            metrics["grad_norms"] = norms(result.grads)  # whole-tensor norms under sharding
        return new_state, metrics

    def _run_grads(self, pieces: StepPieces, state: TrainState, batch: Batch) -> GradResult:
        """`pieces.grads`, halving the microbatch on CUDA out-of-memory when it is "auto"."""
        if self.config.microbatch_size != "auto" or self._device_type != "cuda":
            return pieces.grads(pieces, state, batch)
        while True:
            try:
                return pieces.grads(pieces, state, batch)
            except torch.cuda.OutOfMemoryError:
                current = self._grads_piece.microbatch or num_samples(batch)
                if current <= 1:
                    raise
                self._grads_piece.microbatch = current // 2  # remembered: a performance cache only
                torch.cuda.empty_cache()


def _own_algorithms(config: StepConfig) -> tuple[Algorithm, ...]:
    """The algorithms the step's options stand for, composed before the user's."""
    if config.precision == "amp_fp16":
        return (precision_lib.loss_scaling(),)  # its guard skips non-finite steps already
    if config.skip_nonfinite:
        return (skip_nonfinite(),)
    return ()


def _grad_norm(grads: dict, plain: bool) -> torch.Tensor:
    """The global gradient norm; for plain tensors of one dtype and device, in two kernels."""
    if not plain or not grads:
        return global_norm(grads)
    with torch.no_grad():
        norms = _torch.foreach_norm(list(grads.values()))
        dtype = torch.float64 if norms[0].dtype == torch.float64 else torch.float32
        return torch.linalg.vector_norm(torch.stack(norms), dtype=dtype)


def make_step(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, Batch], Any],
    optimizer: Any,
    *,
    precision: str = "fp32",
    microbatch_size: int | str | None = None,
    weight_by: str = "samples",
    count_tokens: Callable[[Batch], int] | None = None,
    skip_nonfinite: bool = False,
    donate: bool = False,
    grad_mode: str = "autograd",
    report_grad_norms: bool = False,
) -> Step:
    """Build the training step for `model`, `loss_fn` and `optimizer`.

    Args:
        model: the module (used as a skeleton: the state's params are swapped in per call).
        loss_fn: `loss_fn(model, batch) -> loss | (loss, aux_dict)`, a mean over the batch.
        optimizer: a `functrain.optim.Transform` (the one `init` used).
        precision: "fp32", "amp_bf16" or "amp_fp16" (dynamic loss scale in
            `state.algo_state["loss_scale"]`; an overflowing step is skipped, as
            `skip_nonfinite` does).
        microbatch_size: split each batch into chunks of this many samples and accumulate
            gradients (None: no split; "auto": on CUDA, halve on out-of-memory until it fits).
        weight_by: weight each microbatch's loss by its "samples" or its "tokens".
        count_tokens: `batch -> int`, the number of tokens (for metrics and `weight_by="tokens"`).
        skip_nonfinite: skip the update of a step whose loss or gradient norm is not finite:
            params, buffers and optimizer state (its counters too) stay exactly as they were,
            donated or not; `state.step` and the timestamp advance (the batch was consumed);
            `metrics["skipped"]` tells (a 0-d bool tensor: decided on the device, no sync).
        donate: reuse the input state's memory (update in place); the input state is consumed.
        grad_mode: "autograd" (`torch.autograd.grad`, DTensor-safe) or "func"
            (`torch.func.grad`).
        report_grad_norms: add per-parameter gradient norms as metrics["grad_norms"].
    Returns:
        a `Step`: `state, metrics = step(state, batch)`. Metrics: "loss", "grad_norm", "lr",
        "samples", "tokens", the loss function's aux values, and "skipped" when a guard is on.
    """
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, batch)")
    config = StepConfig(
        precision=precision,
        microbatch_size=microbatch_size,
        weight_by=weight_by,
        count_tokens=count_tokens,
        skip_nonfinite=skip_nonfinite,
        donate=donate,
        grad_mode=grad_mode,
        report_grad_norms=report_grad_norms,
    )
    check_config(config)
    return Step(model, loss_fn, optimizer, config)


def compose(step: Step, *algorithms: Algorithm) -> Step:
    """A new step with `algorithms` applied to `step`'s pieces, in list order.

    Each algorithm wraps the pieces produced by the ones before it; for the `prepare` piece this
    means an algorithm later in the list sees the batch the earlier ones produced. Compose
    before compiling: `compile_step(compose(step, ...))`.

    Raises:
        TypeError: `step` is not a `Step` (a compiled step, a plain function), or an argument is
            not an `Algorithm`.
        ValueError: a surgery algorithm (BlurPool, ChannelsLast, ...) whose surgery has not run
            on the step's model (`functrain.apply_surgery`, before `init`).
    Example:
        >>> step = compose(make_step(model, loss_fn, opt), label_smoothing(0.1), ema())
    """
    if not isinstance(step, Step):
        hint = (
            "compose the eager step, then compile it: compile_step(compose(step, ...))"
            if type(step).__name__ == "CompiledStep"
            else "build it with functrain.make_step(model, loss_fn, optimizer)"
        )
        raise TypeError(f"compose takes a Step from make_step, got {type(step).__name__}; {hint}")
    for algorithm in algorithms:
        if not isinstance(algorithm, Algorithm):
            raise TypeError(
                f"compose takes functrain Algorithm objects, got {type(algorithm).__name__}"
            )
    check_surgery_applied(step.model, algorithms)
    return Step(
        step.model, step.loss_fn, step.optimizer, step.config, step.algorithms + tuple(algorithms)
    )
