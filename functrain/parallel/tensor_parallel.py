"""Tensor parallelism for the Linear layers of a transformer block (Megatron-style).

A *column-parallel* Linear keeps `out_features / tp` rows of its weight on each `tp` rank and
produces that slice of the output features; the *row-parallel* Linear that follows keeps
`in_features / tp` columns, multiplies the local slice and sums the partial outputs over `tp`. So an
attention or MLP block costs one all-reduce forward and one backward, and the activations between
the two layers never leave the rank.

The collectives are explicit autograd functions (`copy_to_tp`, `reduce_from_tp`,
`gather_from_tp`). The styles are part of the state's `Layout`, not of the model: while the model
runs under a layout (`parallel.running`, entered by the step and by evaluation), `parallel_forwards`
gives each styled Linear its parallel `forward`, and takes it away after, so the module is
untouched outside a step. Model code must size head views from the tensors
(`q.view(B, T, -1, head_dim)`), since a rank holds `n_heads / tp` heads.

Under `compile_step` the parallel forwards are traced with the model: dynamo turns each
collective into a functional collective of the compiled graph (forward and AOTAutograd's
backward), so the step compiles to one graph and a checkpointed block recomputes them inside
it. Those collectives run where no Python does, so they are not counted in `comm.COUNTER`.

Example:
    >>> styles = resolve_tp_styles(model, "auto")   # {"blocks.0.attn.q": "colwise", ...}
    >>> with parallel_forwards(model, styles, mesh["tp"].get_group()):
    ...     logits = torch.func.functional_call(model, tp_local_params, (tokens,))
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from . import comm

if TYPE_CHECKING:  # DTensor's module is imported where a placement is made
    from torch.distributed.tensor import Replicate, Shard

STYLES = ("colwise", "rowwise", "colwise_gather")

# Leaf names the "auto" plan recognises (HF Llama/GPT-NeoX/BERT, torchtitan, nanoGPT's MLP, ...).
# A fused QKV projection cannot be split by rows (q, k and v would land on different ranks), so
# names like `qkv` / `c_attn` are deliberately absent.
AUTO_COLWISE = frozenset(
    "q k v q_proj k_proj v_proj query key value wq wk wv w1 w3 fc1 c_fc up_proj gate_proj "
    "fc_in lin1 up gate".split()
)
AUTO_ROWWISE = frozenset(
    "o o_proj out_proj wo w2 fc2 c_proj down_proj fc_out lin2 down proj dense_4h_to_h".split()
)


def tp_placement(style: str, attr: str) -> Shard | Replicate:
    """The `tp` placement of a Linear's `weight` or `bias` under `style`."""
    from torch.distributed.tensor import Replicate, Shard

    if style in ("colwise", "colwise_gather"):
        return Shard(0)  # output features: rows of the weight and the bias
    if style == "rowwise":
        return Shard(1) if attr == "weight" else Replicate()  # bias added once, after the sum
    raise ValueError(f"unknown tensor-parallel style {style!r}; use one of {STYLES}")


def resolve_tp_styles(model: torch.nn.Module, spec: str | Mapping[str, str]) -> dict[str, str]:
    """`{module name: style}` for the Linear layers that `spec` selects.

    Args:
        model: the module.
        spec: "auto" (pairs of known column/row names under one parent, e.g. `q,k,v` with `o_proj`
            or `fc1` with `fc2`), or `{fnmatch pattern on the module name: style}`.
    Returns:
        the styles, by module name, in model order.
    """
    modules = dict(model.named_modules())
    styles: dict[str, str] = {}
    if spec == "auto":
        parents: dict[str, list[str]] = {}
        for name, module in modules.items():
            if isinstance(module, torch.nn.Linear):
                parent, _, leaf = name.rpartition(".")
                parents.setdefault(parent, []).append(leaf)
        for parent, leaves in parents.items():
            col = [leaf for leaf in leaves if leaf in AUTO_COLWISE]
            row = [leaf for leaf in leaves if leaf in AUTO_ROWWISE]
            if col and row:  # only a matched pair keeps activations local
                prefix = parent + "." if parent else ""
                styles.update({prefix + leaf: "colwise" for leaf in col})
                styles.update({prefix + leaf: "rowwise" for leaf in row})
        if not styles:
            raise ValueError(
                "tp plan 'auto' found no column/row-parallel Linear pairs (names like q/k/v + "
                "o_proj, fc1 + fc2, w1/w3 + w2); pass tp={'<module pattern>': 'colwise' | "
                "'rowwise', ...}"
            )
        return {name: styles[name] for name in modules if name in styles}
    if not isinstance(spec, Mapping):
        raise TypeError(f"tp styles must be 'auto' or a {{pattern: style}} dict, got {spec!r}")
    for pattern, style in spec.items():
        if style not in STYLES:
            raise ValueError(f"tp style for {pattern!r} must be one of {STYLES}, got {style!r}")
        matched = [name for name in modules if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ValueError(f"tp pattern {pattern!r} matches no module of the model")
        for name in matched:
            styles[name] = style
    return {name: styles[name] for name in modules if name in styles}


def check_style(name: str, module: torch.nn.Module, style: str, tp: int) -> None:
    """Raise a clear error unless `module` can run `style` on `tp` ranks."""
    if (
        not isinstance(module, torch.nn.Linear)
        or type(module).forward is not torch.nn.Linear.forward
    ):
        raise TypeError(
            f"tensor parallelism supports torch.nn.Linear layers; {name!r} is "
            f"{type(module).__name__} (leave it out of the tp plan)"
        )
    size = module.out_features if style != "rowwise" else module.in_features
    what = "out_features" if style != "rowwise" else "in_features"
    if size % tp:
        raise ValueError(
            f"tp={tp} does not divide {name}.{what}={size} ({style}); pick a tp degree that "
            "divides it or leave the layer out of the plan"
        )


@contextlib.contextmanager
def parallel_forwards(model: torch.nn.Module, styles: Mapping[str, str], group) -> Iterator[None]:
    """While active, the Linear layers named in `styles` run their tensor-parallel forward.

    Their parameters must then be the `tp` shards (the step's `gather_params` provides them).
    The forward is set on the instances on entry and removed on exit (a forward the instance
    had of its own is put back), so nothing stays on the model.

    Args:
        model: the root module.
        styles: `{module name: "colwise" | "rowwise" | "colwise_gather"}`.
        group: the `tp` process group.
    """
    if not styles:
        yield
        return
    modules = dict(model.named_modules())
    # q, k and v read the same input: one shared `copy_to_tp` turns their three backward
    # all-reduces into one (Megatron's single f per block). Kept for this run of the model only.
    last: list = []
    saved = []
    for name, style in styles.items():
        module = modules[name]
        saved.append((module, module.__dict__.get("forward")))
        module.forward = _instance_forward(module, style, group, last)
    try:
        yield
    finally:
        for module, own in reversed(saved):
            if own is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = own


def _instance_forward(module: torch.nn.Linear, style: str, group, last: list):
    """`module`'s parallel forward for one run, as a closure rather than a partial: dynamo
    guards a closure on its code and on what its cells hold, the same objects every step
    (`last` is a list, guarded by its contents, not its identity), and a partial on its
    identity (a new one every step), with which a compiled step recompiled on every call."""
    run = _rowwise_forward if style == "rowwise" else _colwise_forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        return run(module, style, group, last, x)

    return forward


def _shared_copy(last: list, group, x: torch.Tensor) -> torch.Tensor:
    """`copy_to_tp(x)`, the same one for the layers reading the same `x` in this run: `last`
    holds the last input given to a column-parallel layer and its copy (empty at first)."""
    if torch.compiler.is_compiling():
        # Traced, each layer takes its own copy: remembering the last one mutates an object
        # from outside the traced region, which dynamo refuses inside a checkpointed block
        # ("HOP: Unsafe side effect"), falling back to an eager checkpoint. The backward
        # then sums q, k and v's all-reduced gradients instead of all-reducing their sum
        # (equal up to rounding; two more all-reduces per block in the compiled backward).
        return copy_to_tp(x, group)
    grad = torch.is_grad_enabled()  # sharing is exact either way; keyed on the grad mode
    if last and last[0] is x and last[1] == grad:
        return last[2]
    out = copy_to_tp(x, group)
    last[:] = (x, grad, out)
    return out


def _colwise_forward(self: torch.nn.Linear, style, group, last, x: torch.Tensor):
    y = F.linear(_shared_copy(last, group, x), self.weight, self.bias)
    return gather_from_tp(y, group) if style == "colwise_gather" else y


def _rowwise_forward(self: torch.nn.Linear, style, group, last, x: torch.Tensor):
    y = reduce_from_tp(F.linear(x, self.weight), group)
    return y if self.bias is None else y + self.bias


class _CopyToTP(torch.autograd.Function):
    """Identity forward; backward sums the input gradient over the tp ranks (Megatron's f)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        comm.all_reduce_(grad, ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Forward sums partial outputs over the tp ranks; backward is the identity (Megatron's g)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        comm.all_reduce_(x, group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """Forward concatenates the ranks' last-dim slices; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        n = comm.group_size(group)
        ctx.group, ctx.n, ctx.width = group, n, x.shape[-1]
        # flat on both sides: gloo checks each rank's chunk of the output against the input's
        # shape, which an output of shape (n, *x.shape) fails ("invalid tensor size")
        flat = x.contiguous().reshape(-1)
        out = flat.new_empty(n * flat.numel())
        comm.all_gather_into(out, flat, group)
        out = out.view((n,) + tuple(x.shape))
        return out.movedim(0, -2).reshape(x.shape[:-1] + (n * x.shape[-1],))

    @staticmethod
    def backward(ctx, grad):
        rank = torch.distributed.get_rank(ctx.group) if ctx.n > 1 else 0
        return grad.narrow(-1, rank * ctx.width, ctx.width).contiguous(), None


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """`x` unchanged; its gradient is summed over `group` (skipped for one rank)."""
    return x if comm.group_size(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """The sum of `x` over `group`; the gradient passes through unchanged."""
    return x if comm.group_size(group) == 1 else _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's last-dim slice of `x`, concatenated in rank order."""
    return x if comm.group_size(group) == 1 else _GatherFromTP.apply(x, group)
