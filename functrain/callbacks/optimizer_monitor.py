"""`OptimizerMonitor`: gradient and parameter L2 norms per layer group.

Parameter norms come from `ctx.state.params`. Gradient norms per parameter come from the step's
metrics: build the step with `make_step(..., report_grad_norms=True)` and it returns
`metrics["grad_norms"] = {param name: 0-d tensor}` (norms of the gradients the optimizer
received, before clipping); without it only the global `metrics["grad_norm"]` is logged. Norms of
a group are `sqrt(sum of its members' squared norms)`. Everything is computed on the device and
read in one transfer, on logging steps only.

Sharded parameters (FSDP, TP) count whole: the norms are of the full tensors, the same on every
rank (`functrain.parallel.norms`: one all-reduce per mesh dim for all the parameters), so the
monitor reports what a single-process run would. Every rank must run it (callbacks do).

Example:
    >>> step = functrain.make_step(model, loss_fn, opt, report_grad_norms=True)
    >>> functrain.fit(step, state, loader, duration="1ep",
    ...               callbacks=[OptimizerMonitor(group_by=1)])  # doctest: +SKIP
    # logs "l2_norm/grad/layers", "l2_norm/param/layers", "l2_norm/grad/global", ...
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..loggers.base import to_floats
from ..parallel import full_value, norms
from ..units import TimeLike
from .interval import LogCadence

GroupBy = str | int | Callable[[str], str]


def group_of(name: str, group_by: GroupBy) -> str:
    """The layer group of parameter `name`.

    Args:
        name: a parameter's fully qualified name ("encoder.layers.0.attn.weight").
        group_by: "module" (the owning module: "encoder.layers.0.attn"), "param" (the parameter
            itself), an int depth (2: "encoder.layers"), or a callable `name -> group`.
    Example:
        >>> group_of("encoder.layers.0.weight", 2)
        'encoder.layers'
    """
    if callable(group_by):
        return str(group_by(name))
    if group_by == "param":
        return name
    if group_by == "module":
        return name.rsplit(".", 1)[0] if "." in name else name
    if isinstance(group_by, int) and not isinstance(group_by, bool) and group_by >= 1:
        return ".".join(name.split(".")[:group_by])
    raise ValueError(
        f"group_by must be 'module', 'param', a depth >= 1 or a callable, got {group_by!r}"
    )


def group_norms(
    norms_or_tensors: Mapping[str, torch.Tensor], group_by: GroupBy, *, are_norms: bool
) -> dict[str, torch.Tensor]:
    """`{group: 0-d norm tensor}` from per-parameter tensors (or their norms), on the device.

    Tensors that are DTensors count as the whole tensor (a collective: call on every rank).
    """
    if are_norms:
        values = {k: full_value(torch.as_tensor(v)) for k, v in norms_or_tensors.items()}
    else:
        values = norms(norms_or_tensors)  # whole-tensor norms, one reduction for all
    squares: dict[str, list[torch.Tensor]] = {}
    for name, value in values.items():
        square = value.detach().float().square()
        squares.setdefault(group_of(name, group_by), []).append(square.reshape(()))
    return {group: torch.stack(parts).sum().sqrt() for group, parts in squares.items()}


class OptimizerMonitor:
    """Log L2 norms of gradients and parameters per layer group.

    Keys: "l2_norm/grad/<group>", "l2_norm/param/<group>", "l2_norm/grad/global" and
    "l2_norm/param/global".

    Args:
        interval: when to log; None follows the loop's logging interval.
        group_by: how parameters are grouped (see `group_of`); "module" by default.
        log_param_norms: also log parameter norms.
    """

    def __init__(
        self,
        interval: TimeLike | None = None,
        group_by: GroupBy = "module",
        log_param_norms: bool = True,
    ):
        group_of("check.name", group_by)  # reject a bad group_by now, not mid-run
        self.cadence = LogCadence(interval)
        self.group_by = group_by
        self.log_param_norms = log_param_norms
        self._warned = False

    def batch_end(self, ctx: Any) -> None:
        if not self.cadence.due(ctx):
            return
        metrics = ctx.metrics or {}
        values: dict[str, Any] = {}
        if metrics.get("grad_norm") is not None:
            values["l2_norm/grad/global"] = metrics["grad_norm"]
        grad_norms = metrics.get("grad_norms")
        if grad_norms:
            for group, norm in group_norms(grad_norms, self.group_by, are_norms=True).items():
                values[f"l2_norm/grad/{group}"] = norm
        elif not self._warned:
            self._warned = True
            warnings.warn(
                "OptimizerMonitor: the step reports no per-parameter gradient norms, so only "
                "the global one is logged; build it with make_step(..., report_grad_norms=True)",
                stacklevel=2,
            )
        if self.log_param_norms and ctx.state.params:
            by_group = group_norms(ctx.state.params, self.group_by, are_norms=False)
            for group, norm in by_group.items():
                values[f"l2_norm/param/{group}"] = norm
            values["l2_norm/param/global"] = (
                torch.stack([n.square() for n in by_group.values()]).sum().sqrt()
            )
        if values:
            ctx.log(to_floats(values))  # one device-to-host transfer for all the norms
