"""The step's default `grads` piece and `call_model`: the model run with a state's tensors.

`GradsPiece` is the one place the step runs the user's model. It runs it through a single
wrapper module (`_Apply`, so `torch.func.functional_call` can swap a state's tensors into it for
a call of `fn(model, ...)`), or as it is when the state's tensors *are* the model's own (a
donating run from `init`: the hand-written loop's fast path). Per call it splits the batch into
microbatches, seeds torch's global generator from the step's key around each forward pass (for
`nn.Dropout` and the like), and returns the averaged gradients. Everything installed on the model
for a forward pass is installed by the one `ForwardRun` it makes per call, in the order written in
`forward_run.ORDER`; writing the state's tensors into the model's slots is that order's "slots".

Example:
    >>> grads_piece = GradsPiece(model, config)
    >>> result = grads_piece(pieces, state, batch)      # a GradResult
    >>> outputs = grads_piece.call_model(state, x)
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable

import torch

from .. import _torch
from ..optim._foreach import is_dtensor
from ..parallel import InFlight, data_parallel_info
from ..parallel import buffers as parallel_buffers
from ..parallel import compute as parallel_compute
from ..parallel import offload as parallel_offload
from ..rng import seed_for, seeded_global_rng
from ..state import TrainState, trainable_names
from . import precision as precision_lib
from .batching import num_samples, split_batch
from .forward_run import ForwardRun, ordered
from .pieces import Batch, GradResult, StepConfig, StepPieces


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


class GradsPiece:
    """The default `grads` piece of a step on `model` (and its `call_model`).

    Attributes:
        model: the skeleton module.
        config: the step's `StepConfig`.
        trainable: the names of the parameters that get gradients, in order.
        device_type: where the model lives ("cpu", "cuda"), for autocast and seeding.
        microbatch: the microbatch size in use (None: whole batches); "auto" halves it on CUDA
            out-of-memory (a performance cache: the result does not depend on it).
    """

    def __init__(self, model: torch.nn.Module, config: StepConfig):
        self.model = model
        self.config = config
        self.trainable = trainable_names(model)
        self._trainable_set = frozenset(self.trainable)
        self._module_params = dict(model.named_parameters())
        self._module_buffers = dict(model.named_buffers())
        self._apply_module = _Apply(model)
        # functional_call re-derives tied weights on every call; decide once whether any are.
        self._tied = _has_tied_tensors(model)
        self.device_type = device_type(model)
        self.microbatch = None if config.microbatch_size == "auto" else config.microbatch_size
        self._aliases: tuple | None = None  # state tensors known to be the model's own
        self._slot_cache: tuple | None = None  # (names, their module slots): see `_slots`

    def call_model(self, state: TrainState, *args, **kwargs):
        """Run the model with `state`'s params and buffers, without gradients."""
        layout = state.layout
        run = ForwardRun(self.model, layout, InFlight(layout))  # the layout's installers only
        params = parallel_offload.to_compute(state.params, layout)  # host shards: to the device
        tensors = {**parallel_compute.gather_params(params, layout, run.inflight), **state.buffers}
        with torch.no_grad(), run.installed():
            return self._with_tensors(tensors, _call, *args, **kwargs)

    def _with_tensors(self, tensors: dict, fn: Callable, *args, **kwargs):
        """`fn(model, *args, **kwargs)` with `tensors` swapped into the model for the call."""
        slots = None if self._tied or torch.compiler.is_compiling() else self._slots(tensors)
        if slots is None:  # tied weights (re-derived per call) or traced: functional_call
            return torch.func.functional_call(
                self._apply_module,
                _prefixed("model.", tensors),
                (fn, *args),
                kwargs,
                tie_weights=self._tied,
            )
        # What functional_call does for untied tensors, without its per-call name walking:
        # each tensor written into its module's `_parameters`/`_buffers` slot, restored after.
        originals = [slot[key] for slot, key in slots]
        try:
            for (slot, key), tensor in zip(slots, tensors.values()):
                slot[key] = tensor
            return fn(self.model, *args, **kwargs)
        finally:
            for (slot, key), original in zip(slots, originals):
                slot[key] = original

    def _slots(self, tensors: dict) -> list[tuple[dict, str]] | None:
        """The `(module._parameters or module._buffers, key)` of each name of `tensors`, in
        order (decided once per set of names); None when a name is not a direct slot."""
        names = tuple(tensors)
        known = self._slot_cache
        if known is not None and known[0] == names:
            return known[1]
        slots: list[tuple[dict, str]] | None = []
        for name in names:
            prefix, _, key = name.rpartition(".")
            try:
                owner = self.model.get_submodule(prefix)
            except AttributeError:
                slots = None
                break
            params = _torch.parameter_slots(owner)
            slot = params if key in params else _torch.buffer_slots(owner)
            if key not in slot or slot[key] is None:
                slots = None
                break
            slots.append((slot, key))
        self._slot_cache = (names, slots)
        return slots

    def in_place(self, state: TrainState) -> bool:
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
        if not self.state_is_model(state):
            return False
        self._aliases = (
            tuple(state.params),
            tuple(state.params.values()),
            tuple(state.buffers.values()),
        )
        return True

    def state_is_model(self, state: TrainState) -> bool:
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

    def _forward_loss(
        self, pieces: StepPieces, params, buffers, batch, in_place: bool, run: ForwardRun
    ):
        """`pieces.loss` run with `params` and `buffers` swapped into the model, everything of
        `run` installed around it in its order (`forward_run.ORDER`)."""
        if in_place:  # the model already holds exactly these tensors: no slots to write
            return run.call_loss(self.model, pieces.loss, batch)
        tensors = {**params, **buffers}
        with run.installed():  # input cast, TP, gather at use
            if not run.installers:  # slots, then the loss
                return self._with_tensors(tensors, pieces.loss, batch)
            # slots, then offload and activation checkpointing, then the loss
            return self._with_tensors(tensors, run.call_loss, pieces.loss, batch)

    def __call__(self, pieces: StepPieces, state: TrainState, batch: Batch) -> GradResult:
        """The `grads` piece: forward, `pieces.loss` and gradients, over the microbatches."""
        config = self.config
        layout = state.layout
        # this forward/backward's reductions and gathers at use, and what is installed for it
        run = ForwardRun(self.model, layout, InFlight(layout), ordered(pieces.installers))
        inflight = run.inflight
        rank, _ = data_parallel_info(layout)
        buffers = state.buffers
        if not config.donate:  # BatchNorm updates its statistics in place: work on copies
            buffers = {k: v.clone() for k, v in buffers.items()}
        # fsdp(offload=True): the shards live on the host; compute runs on copies on the device
        # (the identity without offload), and the gradients go back to the host at the end.
        state_params = parallel_offload.to_compute(state.params, layout)
        frozen = {}
        if len(self.trainable) != len(state_params):
            frozen = parallel_compute.gather_params(
                {k: v for k, v in state_params.items() if k not in self._trainable_set},
                layout,
                inflight,
            )
        microbatches = split_batch(batch, self.microbatch) if self.microbatch else [batch]
        weights = microbatch_weights(microbatches, config)
        in_place = self.in_place(state)
        autocast = precision_lib.autocast_context
        precision, device_type = config.precision, self.device_type

        def make_objective(index: int, microbatch: Batch, weight: float):
            def objective(compute: dict) -> tuple[torch.Tensor, tuple]:
                """The weighted loss of one microbatch, given the gathered trainable params."""
                with self._forward_rng(state, rank, index), autocast(precision, device_type):
                    params = {**frozen, **compute} if frozen else compute
                    loss, aux = self._forward_loss(
                        pieces, params, buffers, microbatch, in_place, run
                    )
                value = loss if loss.dtype is torch.float32 else loss.float()
                return (value if weight == 1.0 else value * weight), (loss, aux)

            return objective

        objectives = [
            make_objective(i, mb, w) for i, (mb, w) in enumerate(zip(microbatches, weights))
        ]
        source = self._module_params if in_place else state_params
        if config.grad_mode == "func":
            grads, outs = self._func_grads(source, objectives, layout)
        else:
            # The model's own Parameters already require grad; other tensors get fresh leaves.
            leaves = {
                k: source[k] if in_place else source[k].detach().requires_grad_()
                for k in self.trainable
            }
            plain = in_place or not any(map(is_dtensor, leaves.values()))  # in place: plain
            if len(objectives) == 1 and plain:
                grads, outs = _plain_grads(leaves, objectives[0])
            else:  # one gather and one reduction per step, however many microbatches
                grads, outs = parallel_compute.accumulate_grads(
                    leaves, objectives, layout, inflight
                )
        if len(outs) == 1:
            total_loss = outs[0][1][0].detach()
            total_loss = total_loss if total_loss.dtype is torch.float32 else total_loss.float()
        else:
            total_loss = sum(loss.detach().float() * w for (_, (loss, _)), w in zip(outs, weights))
        aux = outs[-1][1][1]
        grads = parallel_compute.finalize_grads(
            dict(zip(self.trainable, grads)), state_params, layout, inflight
        )
        grads = parallel_offload.grads_to_host(grads, layout)  # after every reduction finished
        # The forward pass moved each rank's buffers (BatchNorm) by its own batch: rank 0's win.
        buffers = parallel_buffers.broadcast_buffers(buffers, layout)
        return GradResult(grads=grads, loss=total_loss, aux=aux, buffers=buffers)

    def _forward_rng(self, state: TrainState, rank: int, index: int):
        """The context seeding the global generator for microbatch `index` of this step."""
        if torch.compiler.is_compiling():  # compile_step seeds once, outside the graph
            return contextlib.nullcontext()
        seed = seed_for(state.rng, state.step, "forward", rank * 65536 + index)
        return seeded_global_rng(seed, self.device_type)

    def _func_grads(self, source: dict, objectives: list, layout) -> tuple[list, list]:
        """Gradients by `torch.func.grad`, summed over the microbatches' objectives."""
        leaves = {k: source[k] for k in self.trainable}
        total, outs = None, []
        for objective in objectives:

            def with_aux(leaves, objective=objective):
                value, rest = objective(parallel_compute.gather_params(leaves, layout))
                return value, (value.detach(), rest)

            grads, out = torch.func.grad(with_aux, has_aux=True)(leaves)
            grads = list(grads.values())
            total = grads if total is None else _torch.foreach_add(total, grads)
            outs.append(out)
        return total, outs


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


def device_type(model: torch.nn.Module) -> str:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device.type
    return "cpu"


def microbatch_weights(microbatches: list, config: StepConfig) -> list[float]:
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
