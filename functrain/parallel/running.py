"""`running(model, layout, inflight)`: what a model needs from its layout while it runs.

Three things of a layout act on the model's forward, and only while the step (or evaluation)
runs it, so nothing is left on the user's module between steps and two layouts of one model
never meet:

- mixed precision: with `param_dtype`, the root module's floating-point inputs are cast to it
  (FSDP2's `cast_forward_inputs`), since the gathered parameters are in that dtype;
- tensor parallelism: the styled Linear layers run their parallel forward (`tensor_parallel`);
- gathering at use: with `reshard_after_forward`, modules gather their parameters when called
  (`reshard`, from the placeholders recorded in `inflight`).

They are installed in `LAYOUT_ORDER`, the outer part of the step's order
(`step.forward_run.ORDER`, whose `ForwardRun` also hands `inflight` to the algorithms that
install something for the forward).

When the first two are already on the model (a caller that installed them around a compiled
region), `running` finds them and adds nothing.

Example:
    >>> inflight = InFlight(state.layout)
    >>> compute = gather_params(state.params, state.layout, inflight)
    >>> with running(model, state.layout, inflight):
    ...     logits = torch.func.functional_call(model, compute, (x,))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .. import _torch
from . import reshard, tensor_parallel
from .collectives import InFlight
from .layout import Layout


class _InputCast:
    """A forward pre-hook casting floating-point inputs to `dtype` (recognised by its type)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, module: torch.nn.Module, args: Any, kwargs: Any):
        from ..tree import tree_map

        def to(x):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return x.to(self.dtype)
            return x

        return tree_map(to, args), tree_map(to, kwargs)


@contextlib.contextmanager
def casting_inputs(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """While active, `model`'s floating-point inputs are cast to `dtype` (None: no cast)."""
    installed = any(
        isinstance(hook, _InputCast) and hook.dtype == dtype
        for hook in _torch.forward_pre_hooks(model)
    )
    if dtype is None or installed:
        yield
        return
    handle = model.register_forward_pre_hook(_InputCast(dtype), with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def tp_installed(model: torch.nn.Module, styles: dict[str, str]) -> bool:
    """True when the tensor-parallel forwards of `styles` are already on `model`'s layers."""
    modules = dict(model.named_modules())
    first = modules.get(next(iter(styles)))
    return first is not None and "forward" in first.__dict__


# The layout's installers, outermost first (the step's whole order, with the slots and the
# algorithms' installers inside these, is `step.forward_run.ORDER`). They act only when a module
# is called, so among themselves any order gives the same forward.
LAYOUT_ORDER = ("input_cast", "tensor_parallel", "gather_at_use")
# What a checkpointed module's recomputation, in the backward pass, needs again (the installers
# are gone by then): not the input cast (a pre-hook on the root, which is never recomputed) nor
# the saved-tensor hooks (checkpoint keeps what it recomputes).
RECOMPUTE_ORDER = ("tensor_parallel", "gather_at_use")
_NOTHING = contextlib.nullcontext()  # reusable: no allocation for a forward without a layout


def running(
    model: torch.nn.Module, layout: Layout | None, inflight: InFlight | None = None
) -> contextlib.AbstractContextManager[None]:
    """Run `model` under `layout` inside this block (see the module docstring).

    The layout's part (`LAYOUT_ORDER`) of what the step installs for a forward
    (`functrain.step.forward_run`), for a forward run by hand.

    Args:
        model: the root module (the one given to `functrain.init`).
        layout: the state's layout; None: a no-op.
        inflight: the step's `InFlight` holding placeholders to gather at use (None: none).
    Returns:
        the context manager installing them.
    """
    if layout is None:
        return _NOTHING
    return _installed(model, layout, inflight, LAYOUT_ORDER)


def recomputing(
    model: torch.nn.Module, layout: Layout | None, inflight: InFlight | None = None
) -> contextlib.AbstractContextManager[None]:
    """What a checkpointed module's recomputation needs of the layout (`RECOMPUTE_ORDER`), for
    activation checkpointing to enter around it in the backward pass.

    Example:
        >>> with recomputing(model, layout, inflight):
        ...     out = module(*args)
    """
    if layout is None:
        return _NOTHING
    return _installed(model, layout, inflight, RECOMPUTE_ORDER, recompute=True)


@contextlib.contextmanager
def _installed(
    model: torch.nn.Module,
    layout: Layout,
    inflight: InFlight | None,
    names: tuple[str, ...],
    recompute: bool = False,
) -> Iterator[None]:
    table = _RECOMPUTE if recompute else _LAYOUT
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(table[name](model, layout, inflight))
        yield


def _input_cast(model, layout, inflight) -> contextlib.AbstractContextManager[None]:
    return casting_inputs(model, layout.param_dtype)


def _tensor_parallel(model, layout, inflight) -> contextlib.AbstractContextManager[None]:
    styles = dict(layout.tp_styles)
    if not styles or tp_installed(model, styles):  # none, or already there (compile_step)
        return _NOTHING
    return tensor_parallel.parallel_forwards(model, styles, layout.tp_group)


def _gather_at_use(model, layout, inflight) -> contextlib.AbstractContextManager[None]:
    return reshard.gathering_at_use(inflight)


def _gather_modules(model, layout, inflight) -> contextlib.AbstractContextManager[None]:
    return reshard.gathering_modules(inflight)  # module by module: no saved-tensor hooks


# name -> `(model, layout, inflight) -> context manager`, for the names of LAYOUT_ORDER and of
# RECOMPUTE_ORDER (fixed tables, not registries: nothing adds to them)
_LAYOUT = {
    "input_cast": _input_cast,
    "tensor_parallel": _tensor_parallel,
    "gather_at_use": _gather_at_use,
}
_RECOMPUTE = {"tensor_parallel": _tensor_parallel, "gather_at_use": _gather_modules}
