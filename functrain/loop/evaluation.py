"""`evaluate` and `predict`: a state's params run over data without gradients, with callbacks.

`fit` evaluates through the same `run_eval`, so a standalone evaluation and one inside a run
report the same numbers. The model runs through the step's `evaluator().call_model` (a step) or
`torch.func.functional_call` (a plain module with a state's tensors), in eval mode. The loss and
the metrics share one forward pass: `loss_fn` and `eval_fn` receive a
`functrain.step.model_calls.ModelCalls`, so `eval_fn` calling the model with the same tensors as
`loss_fn` did gets the outputs `loss_fn` saw; without `eval_fn` the metrics use the outputs of
`loss_fn`'s first model call (or `model(batch[input_key])` when there is no loss).

Example:
    >>> metrics = evaluate(step, state, Loader(test_set, 512, shuffle=False, drop_last=False),
    ...                    metrics=["accuracy"])
    >>> logits = torch.cat(predict(step, state, Loader(test_set, 512, shuffle=False)))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..data import place
from ..metrics import Mean, resolve_metrics
from ..state import TrainState
from ..step.batching import to_device
from ..step.model_calls import ModelCalls
from ..step.pieces import normalize_loss
from ..step.protocol import as_step
from .events import Context, Event, dispatch

__all__ = ["describe_batch", "evaluate", "predict"]


def dp_info(state: Any) -> tuple[int, int]:
    """`(rank, world_size)` of data parallelism of `state` (`(0, 1)` without a layout).

    `state` is a TrainState, None, or a pytree of TrainStates (multi-model training), whose
    layouts must agree on the data-parallel coordinates, since the states read the same batches.
    """
    import optree

    from ..parallel import data_parallel_info
    from ..tree import NAMESPACE

    states = optree.tree_leaves(
        state, is_leaf=lambda x: isinstance(x, TrainState), namespace=NAMESPACE
    )
    found = {data_parallel_info(s.layout) for s in states if isinstance(s, TrainState)}
    if len(found) > 1:
        raise ValueError(
            f"the states are laid out on different data-parallel worlds {sorted(found)}; states "
            "trained together must share one mesh (init each with the same mesh=)"
        )
    return found.pop() if found else (0, 1)


def state_device(state: Any) -> torch.device | None:
    """The device batches go to: the params' device when it is not the CPU, else None.

    `state` is a `TrainState`, or a pytree of states (a step over several models): then the
    device of its first tensor."""
    from ..tree import tree_leaves

    tensors = state.params.values() if isinstance(state, TrainState) else tree_leaves(state)
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            return None if tensor.device.type == "cpu" else tensor.device
    return None


def describe_batch(batch: Any) -> str:
    """A short description of a batch's structure ("tuple of 2: Tensor[32, 8] float32, ...")."""

    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"Tensor{list(x.shape)} {str(x.dtype).replace('torch.', '')}"
        if isinstance(x, Mapping):
            return "dict{" + ", ".join(f"{k!r}: {one(v)}" for k, v in x.items()) + "}"
        if isinstance(x, (list, tuple)):
            return f"{type(x).__name__} of {len(x)}: " + ", ".join(one(v) for v in x)
        return type(x).__name__

    text = one(batch)
    return text if len(text) < 300 else text[:297] + "..."


def _runner(step_or_model: Any, state: TrainState | None):
    """`(call, module, loss_fn)` for a Step or a plain module."""
    if isinstance(step_or_model, torch.nn.Module):
        module = step_or_model
        if state is None:
            return module, module, None
        tensors = {**state.params, **state.buffers}

        def call(*args, **kwargs):
            return torch.func.functional_call(module, tensors, args, kwargs, tie_weights=True)

        return call, module, None
    step = as_step(step_or_model)
    evaluator = step.evaluator()
    if evaluator is None:

        def no_model(*args, **kwargs):
            raise TypeError(
                f"the step {step!r} has no model to evaluate (a plain function): build it with "
                "functrain.make_step, or pass an eval_fn that does not call the model"
            )

        return no_model, None, None
    if state is None:
        raise ValueError("evaluate/predict with a Step need the TrainState whose params to use")

    def call(*args, **kwargs):
        return evaluator.call_model(state, *args, **kwargs)

    return call, evaluator.module, evaluator.loss_fn


def _get(batch: Any, key: Any, what: str) -> Any:
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(
            f"cannot take the {what} from a batch that is a {describe_batch(batch)} with key "
            f"{key!r} ({type(error).__name__}: {error}); pass eval_fn=lambda model, batch: "
            f"(outputs, targets), or {what[:-1]}_key=..."
        ) from None


class _EvalMode:
    """`module.eval()` for a block, restoring the previous mode after."""

    def __init__(self, module: torch.nn.Module | None):
        self.module = module

    def __enter__(self):
        self.was_training = self.module.training if self.module is not None else False
        if self.module is not None:
            self.module.eval()

    def __exit__(self, *exc):
        if self.module is not None:
            self.module.train(self.was_training)


def run_eval(
    step_or_model,
    state,
    data,
    *,
    metrics: dict[str, Any],
    eval_fn,
    emit,
    ctx,
    device,
    input_key=0,
    target_key=1,
) -> dict[str, float]:
    call, module, loss_fn = _runner(step_or_model, state)
    model = ModelCalls(call, module)
    loss_mean = Mean("loss") if loss_fn is not None else None
    for metric in metrics.values():
        metric.reset()
    ctx.eval_metrics = {}
    emit(Event.EVAL_START)
    with _EvalMode(module), torch.no_grad():
        for batch in place(data, ctx.rank, ctx.world_size):  # a Loader: this rank's slices
            if device is not None:
                batch = to_device(batch, device, non_blocking=True)
            ctx.batch, ctx.outputs = batch, None
            emit(Event.EVAL_BATCH_START)
            model.reset()
            if loss_fn is not None:
                loss, _ = normalize_loss(loss_fn(model, batch))
                loss_mean.update(loss, _batch_size(batch))
                model.replay()  # eval_fn's calls reuse the forward passes loss_fn made
            if eval_fn is not None:
                outputs, targets = eval_fn(model, batch)
            else:
                if model.recorded:
                    outputs = model.first_outputs()
                elif metrics:
                    outputs = model(_get(batch, input_key, "inputs"))
                else:
                    outputs = None
                targets = _get(batch, target_key, "targets") if metrics else None
            for metric in metrics.values():
                metric.update(outputs, targets)
            ctx.outputs = outputs
            emit(Event.EVAL_BATCH_END)
    model.reset()  # drop the last batch's recorded outputs
    results = {}
    if loss_mean is not None:
        results["loss"] = loss_mean.compute()
    for name, metric in metrics.items():
        results[name] = metric.compute()
    ctx.eval_metrics = results
    ctx.batch = ctx.outputs = None
    emit(Event.EVAL_END)
    return results


def _batch_size(batch: Any) -> int:
    from ..step.batching import num_samples

    try:
        return num_samples(batch)
    except ValueError:
        return 1


def evaluate(
    step_or_model: Any,
    state: TrainState | None,
    data: Iterable[Any],
    *,
    metrics: Any = None,
    eval_fn: Callable | None = None,
    callbacks: Iterable[Any] = (),
    input_key: Any = 0,
    target_key: Any = 1,
) -> dict[str, float]:
    """Evaluate the state's params on `data`: the mean loss and `metrics`, over all ranks.

    Args:
        step_or_model: a `Step` (its `loss_fn` gives "loss"; the model runs through
            `step.pieces.call_model`) or a `torch.nn.Module` (run with `state`'s tensors, or as
            it is when `state` is None).
        state: the `TrainState` whose params to evaluate.
        data: an iterable of batches (each rank passes its shard, e.g. a
            `Loader(..., shuffle=False, drop_last=False)`).
        metrics: names ("accuracy", "cross_entropy", "perplexity"), metric objects,
            torchmetrics metrics, or `{name: metric}`.
        eval_fn: `(model, batch) -> (outputs, targets)` for the metrics; `model` runs without
            gradients (default: `model(batch[input_key])` and `batch[target_key]`).
        callbacks: receive EVAL_START, EVAL_BATCH_START, EVAL_BATCH_END and EVAL_END.
        input_key, target_key: where inputs and targets sit in a batch (Composer's convention).
    Returns:
        `{"loss": float (with a Step), <metric name>: float, ...}`, reduced over all ranks (every
        rank must call `evaluate`).
    Example:
        >>> evaluate(step, state, test_loader, metrics=["accuracy"])
        {'loss': 0.08, 'accuracy': 0.975}
    """
    rank, world = dp_info(state)
    callbacks = list(callbacks)
    ctx = Context(state=state, rank=rank, world_size=world)
    device = state_device(state) if state is not None else None

    def emit(event: Event) -> None:
        dispatch(event, callbacks, ctx)

    return run_eval(
        step_or_model,
        state,
        data,
        metrics=resolve_metrics(metrics),
        eval_fn=eval_fn,
        emit=emit,
        ctx=ctx,
        device=device,
        input_key=input_key,
        target_key=target_key,
    )


def predict(
    step_or_model: Any,
    state: TrainState | None,
    data: Iterable[Any],
    *,
    predict_fn: Callable | None = None,
    callbacks: Iterable[Any] = (),
    input_key: Any = 0,
    to_cpu: bool = True,
) -> list[Any]:
    """The model's outputs on every batch of `data`, with the state's params and no gradients.

    Args:
        step_or_model: a `Step` or a `torch.nn.Module` (as in `evaluate`).
        state: the `TrainState` whose params to use.
        data: an iterable of batches.
        predict_fn: `(model, batch) -> outputs` (default: `model(batch[input_key])` for a
            tuple/list batch, `model(**batch)` for a dict, `model(batch)` for a tensor).
        callbacks: receive PREDICT_START, PREDICT_BATCH_START, PREDICT_BATCH_END, PREDICT_END.
        input_key: where inputs sit in a tuple/list batch.
        to_cpu: move tensor outputs to the CPU (frees device memory as you go).
    Returns:
        a list with one entry of outputs per batch.
    Example:
        >>> logits = torch.cat(predict(step, state, test_loader))
    """
    rank, world = dp_info(state)
    callbacks = list(callbacks)
    ctx = Context(state=state, rank=rank, world_size=world)
    device = state_device(state) if state is not None else None
    call, module, _ = _runner(step_or_model, state)
    model = ModelCalls(call, module)
    outputs_all = []
    dispatch(Event.PREDICT_START, callbacks, ctx)
    with _EvalMode(module), torch.no_grad():
        for batch in place(data, rank, world):  # a Loader: this rank's slices
            if device is not None:
                batch = to_device(batch, device, non_blocking=True)
            ctx.batch, ctx.outputs = batch, None
            dispatch(Event.PREDICT_BATCH_START, callbacks, ctx)
            model.reset()
            if predict_fn is not None:
                outputs = predict_fn(model, batch)
            elif isinstance(batch, Mapping):
                outputs = model(**batch)
            elif isinstance(batch, (tuple, list)):
                outputs = model(_get(batch, input_key, "inputs"))
            else:
                outputs = model(batch)
            if to_cpu:
                outputs = _to_cpu(outputs)
            ctx.outputs = outputs
            dispatch(Event.PREDICT_BATCH_END, callbacks, ctx)
            outputs_all.append(outputs)
    model.reset()
    ctx.batch = ctx.outputs = None
    dispatch(Event.PREDICT_END, callbacks, ctx)
    return outputs_all


def _to_cpu(outputs: Any) -> Any:
    """Tensors in `outputs` (a tensor, a dict such as a Hugging Face output, a list/tuple) on CPU."""
    if isinstance(outputs, torch.Tensor):
        return outputs.cpu()
    if isinstance(outputs, Mapping):
        moved = {k: _to_cpu(v) for k, v in outputs.items()}
        try:
            return type(outputs)(**moved)
        except TypeError:
            return moved
    if isinstance(outputs, (list, tuple)) and not hasattr(outputs, "_fields"):
        return type(outputs)(_to_cpu(v) for v in outputs)
    return outputs
