"""Checks the step runs once, before any kernel sees bad input: the optimizer state against the
parameters, and surgery algorithms against the model.

`check_opt_state` runs when a step first sees an optimizer state it did not produce itself (a
state from `init`, a restored checkpoint, a hand-made one): a moment of the wrong shape would
otherwise reach a fused kernel that reads past its end. `check_surgery_applied` runs in `compose`:
a surgery algorithm whose surgery never ran would otherwise do nothing, silently.

Example:
    >>> check_opt_state(state.opt_state, {k: state.params[k] for k in trainable})
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import _torch
from ..optim._foreach import is_dtensor
from . import precision as precision_lib

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_SHOWN = 5  # problems listed in one error


def check_opt_state(opt_state: Any, params: Mapping[str, torch.Tensor], layout: Any = None) -> None:
    """Raise a clear error unless every per-parameter leaf of `opt_state` fits its parameter.

    A per-parameter leaf is a tensor stored under a parameter's name in a dict (how every
    functrain transform keeps its moments: `opt_state.0.mu.fc.weight`). It must have the
    parameter's shape and device (for a DTensor parameter: be a DTensor with the same mesh and
    placements, its local piece on the same device) and its dtype, or float32 for a
    float16/bfloat16 parameter. Under a layout that offloads a parameter
    (`fsdp(offload=True)`), that parameter and its leaves must be in host memory: the
    optimizer updates them there.

    Args:
        opt_state: the optimizer state.
        params: `{name: tensor}` of the trainable parameters the state is for.
        layout: the parameters' `functrain.parallel.Layout` (`state.layout`), or None.
    Raises:
        ValueError: naming each leaf that does not fit (the first few) and the fix.
    """
    problems: list[str] = []
    if layout is not None and getattr(layout, "offloaded", False):
        _check_offloaded_params(params, layout, problems)
    _walk(opt_state, "opt_state", params, problems)
    if problems:
        listed = "; ".join(problems[:_SHOWN])
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise ValueError(
            f"the optimizer state does not fit the parameters: {listed}{more}. It was built "
            "for another model (or restored from a checkpoint of one); build it from these "
            "parameters with functrain.init(model, optimizer), or restore a checkpoint saved "
            "from this model."
        )


def _local_device(tensor: torch.Tensor) -> torch.device:
    return _torch.local_tensor(tensor).device if is_dtensor(tensor) else tensor.device


def _check_offloaded_params(params: Mapping[str, torch.Tensor], layout: Any, problems) -> None:
    for name, param in params.items():
        if layout.policy(name).offload and _local_device(param).type != "cpu":
            problems.append(
                f"parameter {name!r} is on {_local_device(param)} but its layout offloads it to "
                "host memory (fsdp(offload=True)); build the state with that plan, or restore "
                "the checkpoint into a state made by it"
            )


def _walk(node: Any, path: str, params: Mapping[str, torch.Tensor], problems: list) -> None:
    if isinstance(node, torch.Tensor) or node is None:
        return
    if isinstance(node, Mapping):
        per_parameter = any(k in params for k in node)
        for key, value in node.items():
            where = f"{path}.{key}"
            if per_parameter and isinstance(value, torch.Tensor):
                if key in params:
                    _check_leaf(where, value, key, params[key], problems)
                else:
                    problems.append(f"{where} is stored under {key!r}, no trainable parameter")
            else:
                _walk(value, where, params, problems)
    elif isinstance(node, tuple) and hasattr(node, "_fields"):
        for field, value in zip(node._fields, node):
            _walk(value, f"{path}.{field}", params, problems)
    elif isinstance(node, (tuple, list)):
        for index, value in enumerate(node):
            _walk(value, f"{path}.{index}", params, problems)


def _check_leaf(where: str, leaf: torch.Tensor, name: str, param: torch.Tensor, problems) -> None:
    if is_dtensor(param) != is_dtensor(leaf):
        kinds = ("a DTensor", "a plain tensor")
        problems.append(
            f"{where} is {kinds[is_dtensor(param)]} but parameter {name!r} is "
            f"{kinds[not is_dtensor(param)]}"
        )
        return
    if tuple(leaf.shape) != tuple(param.shape):
        problems.append(
            f"{where} has shape {tuple(leaf.shape)} but parameter {name!r} has shape "
            f"{tuple(param.shape)}"
        )
    if is_dtensor(param):
        if leaf.device_mesh != param.device_mesh or leaf.placements != param.placements:
            problems.append(
                f"{where} is placed {leaf.placements} but parameter {name!r} is placed "
                f"{param.placements}"
            )
        elif _local_device(leaf) != _local_device(param):  # e.g. on the device, not the host
            problems.append(
                f"{where} is on {_local_device(leaf)} but parameter {name!r} is on "
                f"{_local_device(param)}"
            )
    elif leaf.device != param.device:
        problems.append(f"{where} is on {leaf.device} but parameter {name!r} is on {param.device}")
    dtype_fits = leaf.dtype == param.dtype or (
        param.dtype in _LOW_PRECISION and leaf.dtype == torch.float32
    )
    if not dtype_fits:
        problems.append(f"{where} is {leaf.dtype} but parameter {name!r} is {param.dtype}")


# -- surgery ----------------------------------------------------------------------------------


def check_surgery_applied(model: torch.nn.Module, algorithms: Iterable[Any]) -> None:
    """Raise a clear error when a surgery algorithm's surgery has visibly not run on `model`.

    The test: the algorithm's surgery runs on a copy of `model` whose tensors live on the meta
    device (no memory is copied). It has not run on `model` when that copy gains a module class
    `model` lacks (BlurPool's `BlurConv2d`, SqueezeExcite's blocks, ...) or a tensor changes
    format (ChannelsLast) while no tensor keeps a non-default format (checked for the last
    surgery of the list only: a later one may add tensors in the default format). Re-running a surgery on its own result only adds more of the same
    classes, and a surgery with nothing to change leaves the copy as it was; neither is an error.

    Args:
        model: the step's model.
        algorithms: the algorithms being composed (those without surgery are skipped).
    Raises:
        ValueError: naming the algorithm, what its surgery would change, and the fix.
    """
    surgeries = [a for a in algorithms if getattr(a, "surgery", None) is not None]
    for index, algorithm in enumerate(surgeries):
        # A later surgery may add tensors in the default layout (a factorized convolution after
        # ChannelsLast), so layouts are evidence only for the last surgery in the list.
        last = index == len(surgeries) - 1
        change = _unapplied_change(model, algorithm.surgery, check_layouts=last)
        if change is not None:
            raise ValueError(
                f"compose(step, {algorithm.name}): {algorithm.name}'s model surgery has not been "
                f"applied to the step's model (it would {change}). Surgery changes the "
                "architecture, so it runs once, before init: model = "
                "functrain.apply_surgery(model, algorithms); state = functrain.init(model, "
                "optimizer); step = functrain.compose(functrain.make_step(model, loss_fn, "
                "optimizer), *algorithms)"
            )


def _unapplied_change(model: torch.nn.Module, surgery: Any, check_layouts: bool) -> str | None:
    """What `surgery` would still change in `model` that shows it never ran, or None."""
    try:
        with warnings.catch_warnings():  # the surgery's own notes ("changed nothing") are for
            warnings.simplefilter("ignore")  # apply_surgery; this is only a probe
            after = surgery(_meta_copy(model))
    except Exception:  # noqa: BLE001 - a surgery that cannot run again on its result: applied
        return None
    if not isinstance(after, torch.nn.Module):
        return None
    new = sorted(
        {type(m).__name__ for m in after.modules()} - {type(m).__name__ for m in model.modules()}
    )
    if new:
        return "add " + ", ".join(new)
    before, formats = _tensor_formats(model), _tensor_formats(after)
    changed = [n for n, fmt in formats.items() if n in before and before[n] != fmt]
    # A layout surgery already applied leaves its tensors as they are; tensors a later surgery
    # added (a factorized conv) may still change. Kept non-default layouts are that evidence.
    kept = any(
        formats.get(n) == fmt and not t.is_contiguous()
        for n, fmt, t in _tensors_with_formats(model)
    )
    if check_layouts and changed and not kept:
        return f"change the layout or dtype of {changed[0]}"
    return None


def _tensors_with_formats(model: torch.nn.Module):
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        yield n, (tuple(t.shape), t.dtype, tuple(t.stride())), t


def _tensor_formats(model: torch.nn.Module) -> dict[str, tuple]:
    return {n: fmt for n, fmt, _ in _tensors_with_formats(model)}


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `model` whose parameters and buffers are meta tensors of the same shape,
    dtype and strides (so a surgery can run on it without copying any data)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        meta = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="meta")
        memo[id(p)] = torch.nn.Parameter(meta, requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device="meta")
    return copy.deepcopy(model, memo)


# -- options ----------------------------------------------------------------------------------


def check_config(config: Any) -> None:
    """Raise a clear error for an invalid `StepConfig` (the options of `make_step`)."""

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
