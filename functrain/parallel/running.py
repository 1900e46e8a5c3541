"""`running(model, layout, inflight)`: what a model needs from its layout while it runs.

Three things of a layout act on the model's forward, and only while the step (or evaluation)
runs it, so nothing is left on the user's module between steps and two layouts of one model
never meet:

- mixed precision: with `param_dtype`, the root module's floating-point inputs are cast to it
  (FSDP2's `cast_forward_inputs`), since the gathered parameters are in that dtype;
- tensor parallelism: the styled Linear layers run their parallel forward (`tensor_parallel`);
- gathering at use: with `reshard_after_forward`, modules gather their parameters when called
  (`reshard`, from the placeholders recorded in `inflight`).

They are installed in the order the step's `ForwardRun` declares (`step.forward_run.ORDER`),
which also hands `inflight` to the algorithms that install something for the forward.

Under `torch.compile` the first two are installed outside the compiled region (by
`compile_step`); inside, `running` finds them installed and adds nothing, so the graph does not
break.

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


def running(
    model: torch.nn.Module, layout: Layout | None, inflight: InFlight | None = None
) -> contextlib.AbstractContextManager[None]:
    """Run `model` under `layout` inside this block (see the module docstring).

    The layout's part of the step's `ForwardRun` (`functrain.step.forward_run`, where the order
    of everything installed for a forward is written), for a forward run by hand.

    Args:
        model: the root module (the one given to `functrain.init`).
        layout: the state's layout; None: a no-op.
        inflight: the step's `InFlight` holding placeholders to gather at use (None: none).
    Returns:
        the context manager installing them.
    """
    # imported here: the step builds on this package, not the other way round
    from ..step.forward_run import ForwardRun

    return ForwardRun(model, layout, inflight).installed()
