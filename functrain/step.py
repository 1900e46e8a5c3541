"""The training step: `(state, batch) -> (state, metrics)`, built from small named pieces.

`make_step(model, loss_fn, optimizer)` returns a `Step`. Calling it runs, in order:

    prepare(state, batch)                 -> batch        the data side (MixUp, resizing, ...)
    grads(pieces, state, batch)           -> GradResult   forward + loss + gradients, microbatched;
                                                          calls pieces.loss(model, batch)
    transform_grads(grads, state)         -> grads        clipping, SAM's correction, ...
    update(grads, state)                  -> state        optimizer + apply_updates
    after_update(state)                   -> state        EMA, SWA, ...

The pieces live in a `StepPieces` record on the step (`step.pieces`). A speedup algorithm is an
`Algorithm` whose `apply` rewrites some pieces and leaves the others alone, so
`compose(step, label_smoothing(0.1), ema())` is ordinary function composition.

Purity contract: by default a step never modifies the input state (new tensors are returned, and
BatchNorm statistics are updated on copies). `donate=True` (JAX's `donate_argnums`) lets the step
reuse the input state's memory: parameters and optimizer state are updated in place and the input
state must not be used afterwards. `fit` donates, as the loop owns the state.

Randomness: modules that draw from torch's global generator (dropout, stochastic depth) run with
that generator seeded from `key_for(state.rng, state.step, "forward", rank)` and restored after, so
a run is a pure function of its seed.

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
from collections.abc import Callable
from typing import Any

import torch

from . import precision as precision_lib
from .batching import num_samples, split_batch
from .optim import apply_updates, current_lr, fused_update, global_norm
from .optim._foreach import is_dtensor, placed_alike
from .optim.buffers import BufferPool
from .parallel import compute as parallel_compute
from .parallel.reshard import gathering_at_use
from .pieces import Algorithm, Batch, GradResult, StepConfig, StepPieces, normalize_loss
from .rng import seed_for, seeded_global_rng
from .state import TrainState, trainable_names
from .step_protocol import Evaluator
from .tree import tree_flatten, tree_unflatten


class _LossModule(torch.nn.Module):
    """Wraps `loss_fn(model, batch)` as a module so `functional_call` can swap the params in."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch, loss_fn):
        return loss_fn(self.model, batch)


class _CallModule(torch.nn.Module):
    """Wraps the model so `call_model` can run it with a state's params."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _prefixed(prefix: str, tree: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in tree.items()}


class Step:
    """A training step `(state, batch) -> (state, metrics)`; build it with `make_step`.

    Attributes:
        pieces: the `StepPieces` record.
        model: the skeleton module the params run in.
        config: the `StepConfig`.
        algorithms: the `Algorithm`s composed into it, in order.
    """

    def __init__(self, model, loss_fn, optimizer, config: StepConfig, algorithms=()):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.config = config
        self.algorithms = tuple(algorithms)
        self._trainable = trainable_names(model)
        self._trainable_set = frozenset(self._trainable)
        self._module_params = dict(model.named_parameters())
        self._module_buffers = dict(model.named_buffers())
        self._loss_module = _LossModule(model)
        self._call_module = _CallModule(model)
        self._device_type = _device_type(model)
        self._microbatch = None if config.microbatch_size == "auto" else config.microbatch_size
        pieces = self._base_pieces()
        for algorithm in self.algorithms:
            pieces = algorithm.apply(pieces)
            if not isinstance(pieces, StepPieces):
                raise TypeError(
                    f"algorithm {algorithm.name!r}: apply must return StepPieces, "
                    f"got {type(pieces).__name__}"
                )
        self.pieces = pieces

    # -- building ----------------------------------------------------------------------------

    def with_options(self, **changes) -> Step:
        """The same step with some `StepConfig` options changed (e.g. `donate=True`)."""
        return Step(
            self.model,
            self.loss_fn,
            self.optimizer,
            dataclasses.replace(self.config, **changes),
            self.algorithms,
        )

    # -- the StepLike protocol ----------------------------------------------------------------

    def donated(self) -> Step:
        """This step allowed to update its input state in place (`fit` owns its state)."""
        return self if self.config.donate else self.with_options(donate=True)

    def init_state(self, state: TrainState) -> TrainState:
        """`state` with what this step keeps in it (algorithm states, the fp16 loss scale)."""
        return self.init_algorithms(state)

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

    # -- the default pieces ------------------------------------------------------------------

    def call_model(self, state: TrainState, *args, **kwargs):
        """Run the model with `state`'s params and buffers, without gradients."""
        tensors = {**parallel_compute.gather_params(state.params), **state.buffers}
        with torch.no_grad(), gathering_at_use():
            return torch.func.functional_call(
                self._call_module, _prefixed("model.", tensors), args, kwargs
            )

    def _state_is_model(self, state: TrainState) -> bool:
        """True when `state`'s tensors *are* the model's own (a donating run from `init`).

        Then the model can run as it is, with no parameter swapping: the fast path, exactly what
        a hand-written loop does.
        """
        if (
            self.config.grad_mode != "autograd"
            or not self.config.donate
            or torch.compiler.is_compiling()  # data_ptr comparisons would break the graph
        ):
            return False
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
            return self._loss_module(batch, pieces.loss)

        tensors = _prefixed("model.", {**params, **buffers})
        with gathering_at_use():  # FSDP with reshard_after_forward: modules gather at use
            return torch.func.functional_call(
                self._loss_module, tensors, (batch, pieces.loss), tie_weights=True
            )

    def _grads(self, pieces: StepPieces, state: TrainState, batch: Batch) -> GradResult:
        config = self.config
        rank, _ = parallel_compute.data_parallel_info()
        buffers = state.buffers
        if not config.donate:  # BatchNorm updates its statistics in place: work on copies
            buffers = {k: v.clone() for k, v in buffers.items()}
        frozen = parallel_compute.gather_params(
            {k: v for k, v in state.params.items() if k not in self._trainable_set}
        )
        microbatches = split_batch(batch, self._microbatch) if self._microbatch else [batch]
        weights = _microbatch_weights(microbatches, config)
        scale = None
        if config.precision == "amp_fp16":
            scale = state.algo_state[precision_lib.LOSS_SCALE_KEY].scale
        in_place = self._state_is_model(state)

        def make_objective(index: int, microbatch: Batch, weight: float):
            def objective(compute: dict) -> tuple[torch.Tensor, tuple]:
                """The weighted loss of one microbatch, given the gathered trainable params."""
                with (
                    self._forward_rng(state, rank, index),
                    precision_lib.autocast_context(config.precision, self._device_type),
                ):
                    loss, aux = self._forward_loss(
                        pieces, {**frozen, **compute}, buffers, microbatch, in_place
                    )
                value = loss.float() * weight
                return (value * scale if scale is not None else value), (loss, aux)

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
            # One gather and one reduction per step, however many microbatches.
            grads, outs = parallel_compute.accumulate_grads(leaves, objectives)
        total_loss = sum(loss.detach().float() * w for (_, (loss, _)), w in zip(outs, weights))
        aux = outs[-1][1][1]
        if scale is not None:
            grads = torch._foreach_div(grads, scale)
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

    def _update(self, grads: dict, state: TrainState) -> TrainState:
        """The optimizer update: fused kernels in place, on private copies unless donating.

        Purity is a property, not a price: a pure step copies the trainable params and the
        optimizer state into buffers nobody else holds (recycled from the state of the call
        before, see `functrain.optim.buffers`) and then runs exactly the donating update on
        them. The update is the fused executor (`functrain.optim.fused`: torch's fused kernels
        for the whole composition) when the optimizer has a fused form, else its `update` with
        `donate=True`.
        """
        trainable = {k: state.params[k] for k in grads}
        if torch.compiler.is_compiling():  # traced: the functional path, which inductor fuses
            updates, opt_state = self.optimizer.update(
                grads, state.opt_state, trainable, time=state.timestamp, donate=self.config.donate
            )
            new_params = apply_updates(trainable, updates, donate=self.config.donate)
            return state.replace(params={**state.params, **new_params}, opt_state=opt_state)
        params, opt_state = trainable, state.opt_state
        if not self.config.donate:
            params, opt_state = self._private_copies(params, opt_state)
        new_opt_state = None
        if self._can_fuse(params, grads):
            new_opt_state = fused_update(
                self.optimizer, grads, opt_state, params, time=state.timestamp
            )
        if new_opt_state is None:  # no fused form: the transforms' own in-place path
            updates, new_opt_state = self.optimizer.update(
                grads, opt_state, params, time=state.timestamp, donate=True
            )
            params = apply_updates(params, updates, donate=True)
        return state.replace(params={**state.params, **params}, opt_state=new_opt_state)

    def _private_copies(self, params: dict, opt_state: Any) -> tuple[dict, Any]:
        """Copies of `params` and of `opt_state`'s tensors that this step may update in place."""
        pool = self.__dict__.get("_buffer_pool")
        if pool is None:
            pool = self.__dict__["_buffer_pool"] = BufferPool()
        leaves, spec = tree_flatten(opt_state)
        slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        copies = pool.private_copies([*params.values(), *(leaves[i] for i in slots)])
        for i, copy in zip(slots, copies[len(params) :]):
            leaves[i] = copy
        return dict(zip(params, copies)), tree_unflatten(spec, leaves)

    def _can_fuse(self, params: dict, grads: dict) -> bool:
        """True when the fused executor may run: the optimizer describes itself (`spec`), and
        every parameter and gradient is a plain tensor or a DTensor placed like its parameter
        (the kernels are elementwise, so they run on each rank's local pieces without DTensor's
        per-op dispatch). The executor checks the rest (the composition, dtypes, devices) and
        declines, touching nothing, when it has no fused form."""
        if getattr(self.optimizer, "spec", None) is None or not grads:
            return False
        for name, grad in grads.items():
            param = params[name]
            if is_dtensor(param) or is_dtensor(grad):
                if not placed_alike(param, grad):
                    return False
            elif not (type(param) in _PLAIN_TENSORS and type(grad) in _PLAIN_TENSORS):
                return False
        return True

    # -- the step ----------------------------------------------------------------------------

    def init_algorithms(self, state: TrainState) -> TrainState:
        """`state` with `algo_state` entries for every composed algorithm that lacks one."""
        algo_state = dict(state.algo_state)
        if self.config.precision == "amp_fp16" and precision_lib.LOSS_SCALE_KEY not in algo_state:
            device = next(iter(state.params.values())).device if state.params else "cpu"
            algo_state[precision_lib.LOSS_SCALE_KEY] = precision_lib.init_loss_scale(device=device)
        for algorithm in self.algorithms:
            if algorithm.init is not None and algorithm.name not in algo_state:
                algo_state[algorithm.name] = algorithm.init(state)
        if len(algo_state) == len(state.algo_state):
            return state
        return state.replace(algo_state=algo_state)

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        if not isinstance(state, TrainState):
            raise TypeError(
                f"a step takes (TrainState, batch); got {type(state).__name__} as the state "
                "(build one with functrain.init(model, optimizer))"
            )
        state = self.init_algorithms(state)
        pieces = self.pieces
        batch = pieces.prepare(state, batch)
        result = self._run_grads(pieces, state, batch)
        grad_norm = global_norm(result.grads)
        grads = pieces.transform_grads(result.grads, state)
        new_state = pieces.update(grads, state.replace(buffers=result.buffers))
        finite = None
        if self.config.skip_nonfinite or self.config.precision == "amp_fp16":
            finite = torch.isfinite(grad_norm) & torch.isfinite(result.loss)
            new_state = _select_finite(finite, new_state, state)
        if self.config.precision == "amp_fp16":
            key = precision_lib.LOSS_SCALE_KEY
            scale = precision_lib.update_loss_scale(state.algo_state[key], finite)
            new_state = new_state.replace(algo_state={**new_state.algo_state, key: scale})
        _, world = parallel_compute.data_parallel_info()
        samples = num_samples(batch) * world
        tokens = int(self.config.count_tokens(batch)) * world if self.config.count_tokens else 0
        new_state = new_state.replace(
            step=state.step + 1, timestamp=state.timestamp.advance_batch(samples, tokens)
        )
        new_state = pieces.after_update(new_state)
        metrics = {
            **{
                k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in result.aux.items()
            },
            "loss": parallel_compute.mean_over_data_parallel(result.loss),
            "grad_norm": grad_norm.detach(),
            "lr": current_lr(new_state.opt_state),
            "samples": samples,
            "tokens": tokens,
        }
        if finite is not None:
            metrics["skipped"] = ~finite
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


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _device_type(model: torch.nn.Module) -> str:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device.type
    return "cpu"


def _microbatch_weights(microbatches: list, config: StepConfig) -> list[float]:
    """Each microbatch's share of the batch, by samples or by tokens."""
    if config.weight_by == "samples":
        counts = [num_samples(mb) for mb in microbatches]
    elif config.weight_by == "tokens":
        counts = [int(config.count_tokens(mb)) for mb in microbatches]
    else:
        raise ValueError(f"weight_by must be 'samples' or 'tokens', got {config.weight_by!r}")
    total = sum(counts)
    if total <= 0:
        raise ValueError("the batch is empty (0 samples or tokens): nothing to train on")
    return [c / total for c in counts]


def _select_finite(finite: torch.Tensor, new: TrainState, old: TrainState) -> TrainState:
    """Keep `old`'s params and optimizer state where the step was not finite (no host sync)."""
    from .tree import tree_map

    def pick(a, b):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return torch.where(finite, a, b)
        return a  # counters advance either way; their effect on bias correction is negligible

    return new.replace(
        params=tree_map(pick, new.params, old.params),
        opt_state=tree_map(pick, new.opt_state, old.opt_state),
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
            `state.algo_state["loss_scale"]`).
        microbatch_size: split each batch into chunks of this many samples and accumulate
            gradients (None: no split; "auto": on CUDA, halve on out-of-memory until it fits).
        weight_by: weight each microbatch's loss by its "samples" or its "tokens".
        count_tokens: `batch -> int`, the number of tokens (for metrics and `weight_by="tokens"`).
        skip_nonfinite: keep params and optimizer state unchanged on a step whose loss or
            gradient norm is not finite (metrics["skipped"] tells).
        donate: reuse the input state's memory (update in place); the input state is consumed.
        grad_mode: "autograd" (`torch.autograd.grad`, DTensor-safe) or "func"
            (`torch.func.grad`, what `compile_step` uses).
        report_grad_norms: add per-parameter gradient norms as metrics["grad_norms"].
    Returns:
        a `Step`: `state, metrics = step(state, batch)`.
    """
    precision_lib.check_precision(precision)
    if weight_by == "tokens" and count_tokens is None:
        raise ValueError("weight_by='tokens' needs count_tokens=lambda batch: <number of tokens>")
    if grad_mode not in ("autograd", "func"):
        raise ValueError(f"grad_mode must be 'autograd' or 'func', got {grad_mode!r}")
    if microbatch_size is not None and microbatch_size != "auto":
        if not isinstance(microbatch_size, int) or microbatch_size <= 0:
            raise ValueError(
                f"microbatch_size must be a positive int, 'auto' or None; got {microbatch_size!r}"
            )
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
    return Step(model, loss_fn, optimizer, config)


def compose(step: Step, *algorithms: Algorithm) -> Step:
    """A new step with `algorithms` applied to `step`'s pieces, in list order.

    Each algorithm wraps the pieces produced by the ones before it; for the `prepare` piece this
    means an algorithm later in the list sees the batch the earlier ones produced.

    Example:
        >>> step = compose(make_step(model, loss_fn, opt), label_smoothing(0.1), ema())
    """
    for algorithm in algorithms:
        if not isinstance(algorithm, Algorithm):
            raise TypeError(
                f"compose takes functrain Algorithm objects, got {type(algorithm).__name__}"
            )
    return Step(
        step.model, step.loss_fn, step.optimizer, step.config, step.algorithms + tuple(algorithms)
    )
