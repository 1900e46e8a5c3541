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
first: `precision="amp_fp16"` is `functrain.precision.loss_scaling()`, `skip_nonfinite=True` is
`functrain.guards.skip_nonfinite()`.

Purity contract: by default a step never modifies the input state (new tensors are returned, and
BatchNorm statistics are updated on copies). `donate=True` (JAX's `donate_argnums`) lets the step
reuse the input state's memory: parameters and optimizer state are updated in place and the input
state must not be used afterwards. `fit` donates, as the loop owns the state. A step the guard
skips leaves params, buffers and optimizer state exactly as they were, donated or not.

Randomness: modules that draw from torch's global generator (dropout, stochastic depth) run with
that generator seeded from `key_for(state.rng, state.step, "forward", rank)` and restored after, so
a run is a pure function of its seed.

Decided once: the step checks an optimizer state against the parameters, finds where its learning
rate lives and how to take the gradient norm when it first sees a state it did not produce (see
`functrain.step_plan`); later calls on its own outputs only reuse those decisions.

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

import contextlib
import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch

from . import precision as precision_lib
from .batching import num_samples, split_batch
from .guards import skip_nonfinite
from .optim import apply_updates, global_norm
from .optim._foreach import is_dtensor, placed_alike
from .parallel import compute as parallel_compute
from .parallel.reshard import gathering_at_use
from .pieces import (
    Algorithm,
    Batch,
    GradResult,
    StepConfig,
    StepPieces,
    no_guard,
    normalize_loss,
)
from .rng import seed_for, seeded_global_rng
from .state import TrainState, trainable_names
from .step_checks import check_surgery_applied
from .step_plan import Plans, StatePlan
from .step_protocol import Evaluator

__all__ = ["Algorithm", "GradResult", "Step", "StepPieces", "compose", "make_step"]


class _Apply(torch.nn.Module):
    """`fn(model, *args)` as a module, so `functional_call` can run it with other tensors in the
    model: the one wrapper the step runs the model through (the loss, and `call_model`)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn, *args, **kwargs):
        return fn(self.model, *args, **kwargs)


def _call(model, *args, **kwargs):
    return model(*args, **kwargs)


def _prefixed(prefix: str, tree: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in tree.items()}


def _dp_info() -> tuple[int, int]:
    """`(rank, world_size)` of data parallelism: the one place the step asks (a merge point for
    the Layout, which will pass `state.layout`)."""
    return parallel_compute.data_parallel_info()


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
        self._trainable = trainable_names(model)
        self._trainable_set = frozenset(self._trainable)
        self._module_params = dict(model.named_parameters())
        self._module_buffers = dict(model.named_buffers())
        self._apply_module = _Apply(model)
        # functional_call re-derives tied weights on every call; decide once whether any are.
        self._tied = _has_tied_tensors(model)
        self._device_type = _device_type(model)
        self._microbatch = None if config.microbatch_size == "auto" else config.microbatch_size
        self._plans = Plans()  # performance caches only: what a call decides is the same
        self._aliases: tuple | None = None  # state tensors known to be the model's own
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

    # -- building ----------------------------------------------------------------------------

    def with_options(self, **changes) -> Step:
        """The same step with some `StepConfig` options changed (e.g. `donate=True`)."""
        config = dataclasses.replace(self.config, **changes)
        _check_config(config)
        return Step(self.model, self.loss_fn, self.optimizer, config, self.algorithms)

    # -- the StepLike protocol ----------------------------------------------------------------

    def donated(self) -> Step:
        """This step allowed to update its input state in place (`fit` owns its state)."""
        return self if self.config.donate else self.with_options(donate=True)

    def init_state(self, state: TrainState) -> TrainState:
        """`state` with an `algo_state` entry for every composed algorithm that keeps one (the
        fp16 loss scale included) and lacks it; the same object when nothing is missing."""
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
            algo_state[algorithm.name] = algorithm.init(state)
        return state.replace(algo_state=algo_state)

    init_algorithms = init_state  # the name before the StepLike protocol

    def evaluator(self) -> Evaluator:
        """How evaluation runs this step's model: the module, `call_model`, the loss."""
        return Evaluator(self.model, self.pieces.call_model, self.loss_fn)

    def _base_pieces(self) -> StepPieces:
        return StepPieces(
            prepare=lambda state, batch: batch,
            loss=lambda model, batch: normalize_loss(self.loss_fn(model, batch)),
            grads=self._grads,
            transform_grads=lambda grads, state: grads,
            update=self._update,
            after_update=lambda state: state,
            call_model=self.call_model,
        )

    # -- running the model -------------------------------------------------------------------

    def call_model(self, state: TrainState, *args, **kwargs):
        """Run the model with `state`'s params and buffers, without gradients."""
        tensors = {**parallel_compute.gather_params(state.params), **state.buffers}
        with torch.no_grad(), gathering_at_use():
            return self._with_tensors(tensors, _call, *args, **kwargs)

    def _with_tensors(self, tensors: dict, fn: Callable, *args, **kwargs):
        """`fn(model, *args, **kwargs)` with `tensors` swapped into the model for the call."""
        return torch.func.functional_call(
            self._apply_module,
            _prefixed("model.", tensors),
            (fn, *args),
            kwargs,
            tie_weights=self._tied,
        )

    def _in_place(self, state: TrainState) -> bool:
        """True when `state`'s tensors *are* the model's own (a donating run from `init`): then
        the model runs as it is, with no parameter swapping, exactly as a hand-written loop.

        Decided by comparing storage once; later calls on the same tensors (a donating step
        updates them in place) only test identity.
        """
        if (
            self.config.grad_mode != "autograd"
            or not self.config.donate
            or torch.compiler.is_compiling()  # data_ptr comparisons would break the graph
        ):
            return False
        known = self._aliases
        if known is not None:
            names, params, buffers = known
            if (
                tuple(state.params) == names
                and len(state.buffers) == len(buffers)
                and all(map(operator.is_, state.params.values(), params))
                and all(map(operator.is_, state.buffers.values(), buffers))
            ):
                return True
        if not self._state_is_model(state):
            return False
        self._aliases = (
            tuple(state.params),
            tuple(state.params.values()),
            tuple(state.buffers.values()),
        )
        return True

    def _state_is_model(self, state: TrainState) -> bool:
        """True when every tensor of `state` shares storage and shape with the model's own."""
        for names, mine in (
            (state.params, self._module_params),
            (state.buffers, self._module_buffers),
        ):
            if len(names) != len(mine):
                return False
            for k, tensor in mine.items():
                other = names.get(k)
                if (
                    type(other) is not torch.Tensor
                    or other.data_ptr() != tensor.data_ptr()
                    or other.shape != tensor.shape
                ):
                    return False
        return True

    def _forward_loss(self, pieces: StepPieces, params, buffers, batch, in_place: bool = False):
        """`pieces.loss` run with `params` and `buffers` swapped into the model."""
        if in_place:  # the model already holds exactly these tensors
            return pieces.loss(self.model, batch)
        with gathering_at_use():  # FSDP with reshard_after_forward: modules gather at use
            return self._with_tensors({**params, **buffers}, pieces.loss, batch)

    # -- the default grads piece -------------------------------------------------------------

    def _grads(self, pieces: StepPieces, state: TrainState, batch: Batch) -> GradResult:
        config = self.config
        rank, _ = _dp_info()
        buffers = state.buffers
        if not config.donate:  # BatchNorm updates its statistics in place: work on copies
            buffers = {k: v.clone() for k, v in buffers.items()}
        frozen = {}
        if len(self._trainable) != len(state.params):
            frozen = parallel_compute.gather_params(
                {k: v for k, v in state.params.items() if k not in self._trainable_set}
            )
        microbatches = split_batch(batch, self._microbatch) if self._microbatch else [batch]
        weights = _microbatch_weights(microbatches, config)
        in_place = self._in_place(state)
        autocast = precision_lib.autocast_context
        precision, device_type = config.precision, self._device_type

        def make_objective(index: int, microbatch: Batch, weight: float):
            def objective(compute: dict) -> tuple[torch.Tensor, tuple]:
                """The weighted loss of one microbatch, given the gathered trainable params."""
                with self._forward_rng(state, rank, index), autocast(precision, device_type):
                    params = {**frozen, **compute} if frozen else compute
                    loss, aux = self._forward_loss(pieces, params, buffers, microbatch, in_place)
                value = loss if loss.dtype is torch.float32 else loss.float()
                return (value if weight == 1.0 else value * weight), (loss, aux)

            return objective

        objectives = [
            make_objective(i, mb, w) for i, (mb, w) in enumerate(zip(microbatches, weights))
        ]
        source = self._module_params if in_place else state.params
        if config.grad_mode == "func":
            grads, outs = self._func_grads(source, objectives)
        else:
            # The model's own Parameters already require grad; other tensors get fresh leaves.
            leaves = {
                k: source[k] if in_place else source[k].detach().requires_grad_()
                for k in self._trainable
            }
            plain = in_place or not any(map(is_dtensor, leaves.values()))  # in place: plain
            if len(objectives) == 1 and plain:
                grads, outs = _plain_grads(leaves, objectives[0])
            else:  # one gather and one reduction per step, however many microbatches
                grads, outs = parallel_compute.accumulate_grads(leaves, objectives)
        if len(outs) == 1:
            total_loss = outs[0][1][0].detach()
            total_loss = total_loss if total_loss.dtype is torch.float32 else total_loss.float()
        else:
            total_loss = sum(loss.detach().float() * w for (_, (loss, _)), w in zip(outs, weights))
        aux = outs[-1][1][1]
        grads = parallel_compute.finalize_grads(dict(zip(self._trainable, grads)), state.params)
        return GradResult(grads=grads, loss=total_loss, aux=aux, buffers=buffers)

    def _forward_rng(self, state: TrainState, rank: int, index: int):
        """The context seeding the global generator for microbatch `index` of this step."""
        if torch.compiler.is_compiling():  # compile_step seeds once, outside the graph
            return contextlib.nullcontext()
        seed = seed_for(state.rng, state.step, "forward", rank * 65536 + index)
        return seeded_global_rng(seed, self._device_type)

    def _func_grads(self, source: dict, objectives: list) -> tuple[list, list]:
        """Gradients by `torch.func.grad`, summed over the microbatches' objectives."""
        leaves = {k: source[k] for k in self._trainable}
        total, outs = None, []
        for objective in objectives:

            def with_aux(leaves, objective=objective):
                value, rest = objective(parallel_compute.gather_params(leaves))
                return value, (value.detach(), rest)

            grads, out = torch.func.grad(with_aux, has_aux=True)(leaves)
            grads = list(grads.values())
            total = grads if total is None else torch._foreach_add(total, grads)
            outs.append(out)
        return total, outs

    # -- the default update piece (the optim engineer's fused fast path) ----------------------

    def _update(self, grads: dict, state: TrainState) -> TrainState:
        donate = self.config.donate
        trainable = {k: state.params[k] for k in grads}
        if donate and self._can_fuse(trainable, grads):
            # One fused kernel updates the (donated) params and moments in place.
            opt_state = self.optimizer.fused_update(
                grads, state.opt_state, trainable, time=state.timestamp
            )
            return state.replace(opt_state=opt_state)
        updates, opt_state = self.optimizer.update(
            grads, state.opt_state, trainable, time=state.timestamp, donate=donate
        )
        new_params = apply_updates(trainable, updates, donate=donate)
        return state.replace(params={**state.params, **new_params}, opt_state=opt_state)

    def _can_fuse(self, params: dict, grads: dict) -> bool:
        """True when the optimizer's fused in-place path applies: one device and dtype, outside
        torch.compile (which fuses the foreach path itself), and either plain tensors or DTensors
        placed exactly like their parameter (the kernel is elementwise, so it runs on each rank's
        local pieces without DTensor's per-op dispatch)."""
        if getattr(self.optimizer, "fused_update", None) is None or torch.compiler.is_compiling():
            return False
        if not grads:
            return False
        locals_ = []
        for name, grad in grads.items():
            param = params[name]
            if is_dtensor(param) or is_dtensor(grad):
                if not placed_alike(param, grad):
                    return False
                param, grad = param._local_tensor, grad._local_tensor
            elif type(param) is not torch.Tensor or type(grad) is not torch.Tensor:
                return False
            locals_ += [param, grad]
        first = locals_[0]
        return all(t.dtype == first.dtype and t.device == first.device for t in locals_) and (
            first.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
        )

    # -- the step ----------------------------------------------------------------------------

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        if not isinstance(state, TrainState):
            raise TypeError(
                f"a step takes (TrainState, batch); got {type(state).__name__} as the state "
                "(build one with functrain.init(model, optimizer))"
            )
        state = self.init_state(state)
        plan = self.plan_for(state)
        new_state, metrics = self._fold(plan, state, batch)
        self._plans.produced(new_state.opt_state, plan)
        metrics["lr"] = plan.read_lr(new_state.opt_state)
        return new_state, metrics

    def plan_for(self, state: TrainState) -> StatePlan:
        """What this step decided for `state`'s structure (checking it when it is new to it).

        Raises:
            ValueError: `state.opt_state` does not fit the trainable parameters.
        """
        return self._plans.plan_for(
            state.opt_state, lambda: {k: state.params[k] for k in self._trainable}
        )

    def _fold(self, plan: StatePlan, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        """The pieces run in order, and the metrics (all but "lr", read by the caller)."""
        pieces = self.pieces
        batch = pieces.prepare(state, batch)
        _, world = _dp_info()
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
        grad_norm = _grad_norm(result.grads, plan.plain_grads)
        grads = pieces.transform_grads(result.grads, state)
        with_buffers = (
            state if result.buffers is state.buffers else state.replace(buffers=result.buffers)
        )
        guarded, skipped = pieces.guard(result, grad_norm, with_buffers)
        if skipped:  # nothing is written: params, buffers and optimizer state stay as they were
            if saved is not None:
                torch._foreach_copy_(list(state.buffers.values()), saved)
            new_state = guarded.replace(
                buffers=state.buffers,
                step=state.step + 1,
                timestamp=state.timestamp.advance_batch(samples, tokens),
            )
        else:
            new_state = pieces.update(grads, guarded)
            new_state = new_state.replace(
                step=state.step + 1, timestamp=state.timestamp.advance_batch(samples, tokens)
            )
        new_state = pieces.after_update(new_state)
        metrics = {
            k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in result.aux.items()
        }
        metrics["loss"] = parallel_compute.mean_over_data_parallel(result.loss)
        metrics["grad_norm"] = grad_norm
        metrics["samples"] = samples
        metrics["tokens"] = tokens
        if self._guarded:
            metrics["skipped"] = skipped
        if self.config.report_grad_norms:
            metrics["grad_norms"] = {
                k: torch.linalg.vector_norm(g.detach()) for k, g in result.grads.items()
            }
        return new_state, metrics

    def _run_grads(self, pieces: StepPieces, state: TrainState, batch: Batch) -> GradResult:
        """`pieces.grads`, halving the microbatch on CUDA out-of-memory when it is "auto"."""
        if self.config.microbatch_size != "auto" or self._device_type != "cuda":
            return pieces.grads(pieces, state, batch)
        while True:
            try:
                return pieces.grads(pieces, state, batch)
            except torch.cuda.OutOfMemoryError:
                current = self._microbatch or num_samples(batch)
                if current <= 1:
                    raise
                self._microbatch = current // 2  # remembered: a performance cache only
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
        norms = torch._foreach_norm(list(grads.values()))
        dtype = torch.float64 if norms[0].dtype == torch.float64 else torch.float32
        return torch.linalg.vector_norm(torch.stack(norms), dtype=dtype)


def _plain_grads(leaves: dict, objective: Callable) -> tuple[list, list]:
    """`accumulate_grads` for one microbatch of plain tensors: nothing to gather or reduce, so
    one `torch.autograd.grad`, as a hand-written loop's `backward()`."""
    with torch.enable_grad():
        value, aux = objective(leaves)
    params = list(leaves.values())
    grads = torch.autograd.grad(value, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
    return grads, [(None, aux)]  # the step reads only (loss, aux)


def _has_tied_tensors(model: torch.nn.Module) -> bool:
    """True when a parameter or buffer of `model` is reachable under more than one name."""
    for named in (model.named_parameters, model.named_buffers):
        tensors = [t for _, t in named(remove_duplicate=False)]
        if len({id(t) for t in tensors}) != len(tensors):
            return True
    return False


def _device_type(model: torch.nn.Module) -> str:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device.type
    return "cpu"


def _microbatch_weights(microbatches: list, config: StepConfig) -> list[float]:
    """Each microbatch's share of the batch, by samples or by tokens."""
    if len(microbatches) == 1 and config.weight_by == "samples":
        return [1.0]  # the batch's size is checked when the step counts its samples
    if config.weight_by == "samples":
        counts = [num_samples(mb) for mb in microbatches]
    else:
        counts = [int(config.count_tokens(mb)) for mb in microbatches]
    total = sum(counts)
    if total <= 0:
        raise ValueError("the batch is empty (0 samples or tokens): nothing to train on")
    return [c / total for c in counts]


def _check_config(config: StepConfig) -> None:
    precision_lib.check_precision(config.precision)
    if config.weight_by not in ("samples", "tokens"):
        raise ValueError(f"weight_by must be 'samples' or 'tokens', got {config.weight_by!r}")
    if config.weight_by == "tokens" and config.count_tokens is None:
        raise ValueError("weight_by='tokens' needs count_tokens=lambda batch: <number of tokens>")
    if config.grad_mode not in ("autograd", "func"):
        raise ValueError(f"grad_mode must be 'autograd' or 'func', got {config.grad_mode!r}")
    size = config.microbatch_size
    if size is not None and size != "auto":
        # bool is an int subclass: True would pass as a microbatch of one sample
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(
                f"microbatch_size must be a positive int, 'auto' or None; got {size!r}"
            )


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
            `metrics["skipped"]` tells. Costs one host sync per step.
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
    _check_config(config)
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
