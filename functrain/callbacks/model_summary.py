"""`ModelSummary`: a table of the model at fit start, as Lightning's ModelSummary prints it.

One row per module down to `max_depth` (parameters counted with everything below them): its
type, parameter count, trainable count, dtypes, sharding (the DTensor placements, one per mesh
dimension, as torch abbreviates them: "(S(0))" sharded on dim 0, "(R)" replicated; "-" for
plain tensors) and size; then the totals, and what each rank holds when the
parameters are sharded. Counts and sizes are global: a sharded DTensor counts its full shape.

The table is read from the state (`state.params`, `state.buffers`); the module types and which
parameters are trainable (`requires_grad`) come from the model, so pass it to see them. Under
`fit` with several states (a `FitState`), each `TrainState` gets a table.

Example:
    >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[ModelSummary(model)])
      | Name | Type   | Params | Trainable | Dtype   | Sharding | Size
    0 | 0    | Linear | 15     | 15        | float32 | -        | 60 B
    ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["ModelSummary", "SummaryRow", "summarize", "format_summary"]


@dataclasses.dataclass
class SummaryRow:
    """One module's totals: `params` and `trainable` are element counts, `nbytes` global bytes,
    `local_nbytes` the bytes this rank holds; `trainable` is None when the model is unknown."""

    name: str
    type: str
    params: int = 0
    trainable: int | None = 0
    dtypes: set[str] = dataclasses.field(default_factory=set)
    sharding: set[str] = dataclasses.field(default_factory=set)
    nbytes: int = 0
    local_nbytes: int = 0

    def add(self, tensor: torch.Tensor, trainable: bool | None) -> None:
        numel = tensor.numel()  # a DTensor's numel is its global one
        self.params += numel
        if self.trainable is not None:
            self.trainable = None if trainable is None else self.trainable + numel * trainable
        self.dtypes.add(str(tensor.dtype).replace("torch.", ""))
        self.sharding.add(_placements(tensor))
        self.nbytes += numel * tensor.element_size()
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        self.local_nbytes += local.numel() * local.element_size()


def _placements(tensor: torch.Tensor) -> str:
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return "-"
    return "(" + ", ".join(str(p) for p in placements) + ")"


def _modules_of(fqn: str, max_depth: int) -> list[str]:
    """The module paths a parameter counts toward: its ancestors down to `max_depth` ("" for
    a parameter of the root module)."""
    parts = fqn.split(".")[:-1]
    return [".".join(parts[:d]) for d in range(1, min(max_depth, len(parts)) + 1)] or [""]


def summarize(
    params: Mapping[str, torch.Tensor],
    model: torch.nn.Module | None = None,
    *,
    max_depth: int = 1,
) -> list[SummaryRow]:
    """The summary rows of `params`, grouped by module down to `max_depth`, and a total row.

    Args:
        params: `{fqn: tensor or DTensor}` (a `TrainState`'s `params`).
        model: the module, for the module types and `requires_grad`; None: both unknown.
        max_depth: how deep the rows go (1: the model's children; 2: also their children,
            each under its parent; parameters of the model itself get the row "(root)").
    Returns:
        one row per module (a parent before its children, in the order their first parameters
        appear), then the total row (named "total").
    Example:
        >>> rows = summarize(dict(torch.nn.Linear(3, 2).named_parameters()))
        >>> [(r.name, r.params) for r in rows]
        [('(root)', 8), ('total', 8)]
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1 (1: the model's children), got {max_depth}")
    requires_grad = (
        {name: p.requires_grad for name, p in model.named_parameters()}
        if model is not None
        else None
    )
    rows: dict[str, SummaryRow] = {}
    total = SummaryRow("total", "-" if model is None else type(model).__name__)
    for fqn, tensor in params.items():
        trainable = None if requires_grad is None else requires_grad.get(fqn, False)
        for key in _modules_of(fqn, max_depth):
            if key not in rows:
                kind = "-"
                if model is not None:
                    kind = type(model.get_submodule(key) if key else model).__name__
                rows[key] = SummaryRow(key or "(root)", kind)
            rows[key].add(tensor, trainable)
        total.add(tensor, trainable)
    return [*rows.values(), total]


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def format_summary(
    rows: list[SummaryRow], buffers: Mapping[str, torch.Tensor] | None = None
) -> str:
    """The table of `summarize`'s rows and the totals, as text.

    Args:
        rows: from `summarize` (the last one is the total).
        buffers: the state's buffers, counted in the totals (BatchNorm statistics, ...).
    Returns:
        the table, one line per row, then the totals.
    Example:
        >>> print(format_summary(summarize(dict(torch.nn.Linear(3, 2).named_parameters()))))
          | Name   | Type | Params | Trainable | Dtype   | Sharding | Size
        0 | (root) | -    | 8      | ?         | float32 | -        | 32 B
        8         Total params
        ?         Trainable params (pass the model to ModelSummary to see)
        32 B      Total size of the parameters
    """
    *modules, total = rows

    def cells(i: str, r: SummaryRow) -> list[str]:
        trainable = "?" if r.trainable is None else str(r.trainable)
        return [i, r.name, r.type, str(r.params), trainable, ",".join(sorted(r.dtypes)),
                ",".join(sorted(r.sharding)), _size(r.nbytes)]  # fmt: skip

    table = [["", "Name", "Type", "Params", "Trainable", "Dtype", "Sharding", "Size"]]
    table += [cells(str(i), r) for i, r in enumerate(modules)]
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    footer = [(str(total.params), "Total params")]
    if total.trainable is None:
        footer.append(("?", "Trainable params (pass the model to ModelSummary to see)"))
    else:
        footer += [
            (str(total.trainable), "Trainable params"),
            (str(total.params - total.trainable), "Non-trainable params"),
        ]
    footer.append((_size(total.nbytes), "Total size of the parameters"))
    if total.local_nbytes != total.nbytes:
        footer.append((_size(total.local_nbytes), "Parameters held by this rank (sharded)"))
    if buffers:
        nbytes = sum(b.numel() * b.element_size() for b in buffers.values())
        footer.append((_size(nbytes), f"Buffers ({len(buffers)} tensors)"))
    lines += [f"{value:<9} {what}" for value, what in footer]
    return "\n".join(lines)


def _train_states(state: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every `TrainState` in `state` (a TrainState, a FitState, or a pytree of them)."""
    from ..state import TrainState

    if isinstance(state, TrainState):
        return [(path, state)]
    inner = getattr(state, "states", None)
    if inner is not None and hasattr(state, "timestamp"):  # a FitState
        return _train_states(inner, path)
    if isinstance(state, Mapping):
        items: Any = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return []
    return [found for k, v in items for found in _train_states(v, f"{path}{k}.")]


class ModelSummary:
    """Print the model summary once at FIT_START (on rank 0).

    Args:
        model: the trained module (or `{state path: module}` for several states), for module
            types and trainable counts; None: both are shown as unknown.
        max_depth: how deep the module rows go (1: the model's children).
        print_fn: where the text goes (default `print`).
    Example:
        >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[ModelSummary(model)])
    """

    def __init__(
        self,
        model: torch.nn.Module | Mapping[str, torch.nn.Module] | None = None,
        *,
        max_depth: int = 1,
        print_fn: Callable[[str], Any] = print,
    ):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1 (1: the model's children), got {max_depth}")
        self.model = model
        self.max_depth = max_depth
        self.print_fn = print_fn
        self.text: str | None = None  # the last summary printed

    def _model_for(self, path: str) -> torch.nn.Module | None:
        if isinstance(self.model, Mapping):
            return self.model.get(path.rstrip("."))
        return self.model

    def fit_start(self, ctx: Any) -> None:
        if getattr(ctx, "rank", 0) != 0:
            return
        parts = []
        for path, state in _train_states(ctx.state):
            rows = summarize(state.params, self._model_for(path), max_depth=self.max_depth)
            table = format_summary(rows, state.buffers)
            parts.append(f"{path.rstrip('.')}:\n{table}" if path else table)
        self.text = "\n\n".join(parts)
        if self.text:
            self.print_fn(self.text)
