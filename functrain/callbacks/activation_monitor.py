"""`ActivationMonitor`: statistics of every module's inputs and outputs, every N batches.

Composer's callback of the same name, on functrain's loop: on a due batch, forward hooks on the
model's modules (registered at BATCH_START, removed at BATCH_END, so other batches run without
them) record, for each floating-point tensor a module takes or returns, the statistics below, and
BATCH_END logs them under Composer's keys:

    activations/max/<module>_input.<i>        the largest value
    activations/average/<module>_output.<i>   the mean value
    activations/l2_norm/<module>_input.<i>    the L2 norm over the last (hidden) dim, averaged
    activations/kurtosis/<module>_output.<i>  Pearson's kurtosis over the last dim, averaged

(`<module>` is the qualified name, "" for the root.) A module called several times in a step
(microbatches, a weight-shared block) contributes every row of every call. A module recomputed
by activation checkpointing runs again in the backward pass; those calls are recognised (they
run inside autograd's backward) and not counted, so the numbers are the same with and without
checkpointing. Under data parallelism (ddp, fsdp, with reshard_after_forward too) each rank sees
its own samples; the statistics are combined over the data-parallel ranks (max of maxes, means
weighted by rows), so every rank logs the global batch's numbers.

Example:
    >>> monitor = ActivationMonitor(model, interval="25ba", ignore_module_types=["Dropout"])
    >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[monitor])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .. import _torch
from ..parallel import comm, data_parallel_info
from ..units import TimeLike
from .interval import Trigger

STATISTICS = ("max", "average", "l2_norm", "kurtosis")


def row_statistics(value: torch.Tensor) -> torch.Tensor:
    """`[max, sum, sum of row L2 norms, sum of row kurtoses, rows, elements]` of `value`
    (float64), the rows being its last dim; sums so that calls and ranks combine exactly."""
    x = value.detach().double()
    rows = x.reshape(-1, x.shape[-1]) if x.dim() > 0 else x.reshape(1, 1)
    centred = rows - rows.mean(dim=-1, keepdim=True)
    var = centred.pow(2).mean(dim=-1).clamp_min(torch.finfo(torch.float64).eps)
    kurtosis = centred.pow(4).mean(dim=-1) / var.pow(2)
    return torch.stack(
        [
            rows.max(),
            rows.sum(),
            torch.linalg.vector_norm(rows, dim=-1).sum(),
            kurtosis.sum(),
            torch.tensor(float(rows.shape[0]), dtype=torch.float64, device=rows.device),
            torch.tensor(float(rows.numel()), dtype=torch.float64, device=rows.device),
        ]
    )


def _layout_of(state: Any):
    """The layout of `state`: a TrainState's, or the first of a pytree of them (multi-model
    training: their data-parallel coordinates agree), or None."""
    import optree

    from ..state import TrainState
    from ..tree import NAMESPACE

    if isinstance(state, TrainState) or state is None:
        return None if state is None else state.layout
    states = optree.tree_leaves(
        state, is_leaf=lambda x: isinstance(x, TrainState), namespace=NAMESPACE
    )
    return next((s.layout for s in states if isinstance(s, TrainState) and s.layout), None)


def _tensors(value: Any) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return list(value)
    return []


class ActivationMonitor:
    """Log statistics of each module's input and output activations every `interval`.

    Args:
        model: the module the step trains (the one given to `make_step`).
        interval: how often (default Composer's "25ba"); a Time, a string, or an int of batches.
        ignore_module_types: class names (or classes) of modules not to watch ("Dropout").
    """

    def __init__(
        self,
        model: torch.nn.Module,
        interval: TimeLike = "25ba",
        ignore_module_types: Iterable[str | type] | None = None,
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                "ActivationMonitor(model, ...) needs the nn.Module the step trains, got "
                f"{type(model).__name__}"
            )
        self.model = model
        self.interval = Trigger(interval)
        ignored = tuple(ignore_module_types or ())
        self._ignored_names = frozenset(t for t in ignored if isinstance(t, str))
        self._ignored_types = tuple(t for t in ignored if isinstance(t, type))
        self._handles: list = []
        self._stats: dict[str, list[torch.Tensor]] = {}

    def _watched(self) -> list[tuple[str, torch.nn.Module]]:
        return [
            (name, module)
            for name, module in self.model.named_modules()
            if type(module).__name__ not in self._ignored_names
            and not isinstance(module, self._ignored_types)
        ]

    def batch_start(self, ctx: Any) -> None:
        if not self.interval.due(ctx.timestamp):
            return
        self._stats = {}
        for name, module in self._watched():
            self._handles.append(
                module.register_forward_hook(
                    lambda m, args, out, name=name: self._record(name, args, out)
                )
            )

    def _record(self, name: str, args: Any, output: Any) -> None:
        if _torch.in_backward_pass():
            return  # recomputed in the backward pass (activation checkpointing): counted already
        for kind, values in (("input", _tensors(args)), ("output", _tensors(output))):
            for i, value in enumerate(values):
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                    key = f"{name}_{kind}.{i}"
                    self._stats.setdefault(key, []).append(row_statistics(value))

    def batch_end(self, ctx: Any) -> None:
        if not self._handles:
            return
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if not self._stats:
            return
        keys = sorted(self._stats)
        per_key = torch.stack([self._combine(self._stats[k]) for k in keys])
        per_key = self._over_ranks(per_key, _layout_of(ctx.state))
        values = per_key.tolist()  # the one host sync
        metrics = {}
        for key, (peak, total, norms, kurt, rows, elements) in zip(keys, values):
            metrics[f"activations/max/{key}"] = peak
            metrics[f"activations/average/{key}"] = total / elements
            metrics[f"activations/l2_norm/{key}"] = norms / rows
            metrics[f"activations/kurtosis/{key}"] = kurt / rows
        self._stats = {}
        ctx.log(metrics)

    @staticmethod
    def _combine(calls: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(calls)
        return torch.cat([stacked[:, :1].max(dim=0).values, stacked[:, 1:].sum(dim=0)])

    @staticmethod
    def _over_ranks(per_key: torch.Tensor, layout) -> torch.Tensor:
        """Max of maxes and sums of sums over the data-parallel ranks (every rank calls)."""
        _, world = data_parallel_info(layout)
        if world == 1:
            return per_key
        group = layout.dp_group
        # one collective for both reductions: gather every rank's few numbers per key
        gathered = [torch.empty_like(per_key) for _ in range(world)]
        comm.all_gather_list(gathered, per_key.contiguous(), group)
        stacked = torch.stack(gathered)
        return torch.cat([stacked[:, :, :1].max(dim=0).values, stacked[:, :, 1:].sum(dim=0)], dim=1)

    def fit_end(self, ctx: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
