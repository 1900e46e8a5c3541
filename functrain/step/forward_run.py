"""`ForwardRun`: one forward pass of the step, and every change made to the model for its length.

Six mechanisms rewrite the user's module while the step runs it, and only then (nothing stays
on the module between steps). They are installed in one order, `ORDER`, outermost first:

    input_cast                a pre-hook on the root casting floating-point inputs to the
                              layout's `param_dtype` (`parallel.running.casting_inputs`)
    tensor_parallel           the styled Linear layers' instance forwards (`tensor_parallel`)
    gather_at_use             module hooks swapping placeholders for gathered tensors, and the
                              saved-tensor hooks that keep views of them as handles (`reshard`)
    slots                     the state's tensors written into the module's parameter and
                              buffer slots (`GradsPiece`, or `functional_call`)
    offload                   `activation_offload`: saved-tensor hooks copying to the host
    activation_checkpointing  `activation_checkpointing`: stand-ins recomputing chosen modules

Why this order:

- saved-tensor hooks stack and the innermost wins, so the order of the three that install them
  is forced: checkpoint's own (a checkpointed module saves nothing) inside offload's (which
  turns views of gathered parameters into gather-at-use handles itself) inside gather-at-use's;
- the stand-ins go inside `slots`: `functional_call` finds tensors by walking the module tree,
  which a stand-in hides (it holds its module outside `_modules`), and a stand-in records the
  tensors its module holds when it is called (those `slots` put there), to install them again
  for the recomputation;
- offload's stand-ins go outside checkpoint's, so its hooks stay outside the recomputation;
- the first three act only when a module is called, so among themselves any order gives the
  same forward; they come first because they belong to the layout, the same for every step, and
  evaluation (`call_model`) installs only them.

The step (`GradsPiece`) makes one `ForwardRun` per forward pass: it holds the model, the layout,
the step's `InFlight` (its in-flight reductions and gathers at use) and the algorithms'
installers. An installer gets the run as its argument, so an algorithm reaches the step's
gathers at use through it (`run.gathered_at_use`), never through the module or a registry.
The user's `loss_fn(model, batch)` and the step's `loss` piece keep their signatures.

Example:
    >>> run = ForwardRun(model, layout, InFlight(layout), ordered(pieces.installers))
    >>> with run.installed():                        # input cast, TP, gather at use
    ...     loss, aux = with_tensors(tensors, run.call_loss, pieces.loss, batch)    # slots, ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..parallel import reshard, tensor_parallel
from ..parallel.running import casting_inputs, tp_installed

if TYPE_CHECKING:
    from ..parallel import InFlight
    from ..parallel.layout import Layout

# Outermost first; see the module docstring for why.
ORDER = (
    "input_cast",
    "tensor_parallel",
    "gather_at_use",
    "slots",
    "offload",
    "activation_checkpointing",
)
LAYOUT_INSTALLERS = ORDER[: ORDER.index("slots")]  # entered by `ForwardRun.installed`
LOSS_INSTALLERS = ORDER[ORDER.index("slots") + 1 :]  # entered by `ForwardRun.call_loss`
# What a checkpointed module's recomputation, in the backward pass, needs again of the layout's
# installers (gone by then): they act when a module is called. Not the input cast (a pre-hook
# on the root, which is never recomputed) nor the saved-tensor hooks (checkpoint keeps what it
# recomputes).
RECOMPUTE_INSTALLERS = ("tensor_parallel", "gather_at_use")
_NOTHING = contextlib.nullcontext()  # reusable: no allocation for a plain forward


class Installer(NamedTuple):
    """What an algorithm installs for one forward pass (in `StepPieces.installers`).

    Attributes:
        name: its place in `ORDER` ("offload" or "activation_checkpointing").
        install: `run -> context manager`, entered inside the slots, around the loss piece.
    """

    name: str
    install: Callable[[ForwardRun], ContextManager[Any]]


def ordered(installers: tuple[Installer, ...]) -> tuple[Installer, ...]:
    """`installers` in `ORDER` (installers of one name keep their composition order).

    Raises:
        ValueError: an installer whose name is not one of `LOSS_INSTALLERS`.
    Example:
        >>> ordered((Installer("activation_checkpointing", f), Installer("offload", g)))
        (Installer(name='offload', ...), Installer(name='activation_checkpointing', ...))
    """
    for installer in installers:
        if installer.name not in LOSS_INSTALLERS:
            raise ValueError(
                f"installer {installer.name!r} has no place in the forward run's order; an "
                f"algorithm's installer is one of {LOSS_INSTALLERS} (see step.forward_run.ORDER)"
            )
    if len(installers) < 2:
        return installers
    return tuple(sorted(installers, key=lambda i: LOSS_INSTALLERS.index(i.name)))


class ForwardRun:
    """One forward pass of the step: the model, its layout, the step's `InFlight`, installers.

    Attributes:
        model: the root module (the one the step was made for).
        layout: the state's layout (None: one process, nothing of a layout to install).
        inflight: the step's reductions and gathers at use (`parallel.InFlight`), or None.
        installers: the algorithms' installers, in `ORDER` (see `ordered`).
    """

    __slots__ = ("model", "layout", "inflight", "installers")

    def __init__(
        self,
        model: torch.nn.Module,
        layout: Layout | None = None,
        inflight: InFlight | None = None,
        installers: tuple[Installer, ...] = (),
    ):
        self.model = model
        self.layout = layout
        self.inflight = inflight
        self.installers = installers

    @property
    def gathered_at_use(self) -> InFlight | None:
        """The `InFlight` whose placeholders modules gather at use in this forward, or None
        (no `fsdp(reshard_after_forward=True)` bucket): what offload and checkpoint need."""
        inflight = self.inflight
        return inflight if inflight is not None and inflight.placeholders else None

    def installed(self) -> ContextManager[None]:
        """The layout's installers (`LAYOUT_INSTALLERS`, in order) for the block's length."""
        if self.layout is None:
            return _NOTHING
        return self._layout_installed()

    def recomputing(self) -> ContextManager[None]:
        """The layout's installers a recomputation needs (`RECOMPUTE_INSTALLERS`), for
        activation checkpointing to enter around it in the backward pass."""
        if self.layout is None:
            return _NOTHING
        return self._layout_installed(RECOMPUTE_INSTALLERS, _RECOMPUTE)

    @contextlib.contextmanager
    def _layout_installed(
        self, names: tuple[str, ...] = LAYOUT_INSTALLERS, table: dict | None = None
    ) -> Iterator[None]:
        table = _LAYOUT if table is None else table
        with contextlib.ExitStack() as stack:
            for name in names:
                stack.enter_context(table[name](self))
            yield

    def call_loss(self, model: Any, loss: Callable, batch: Any) -> Any:
        """`loss(model, batch)` under the algorithms' installers (`LOSS_INSTALLERS`), which run
        inside the slots: call it with the state's tensors already in the model."""
        if not self.installers:
            return loss(model, batch)
        with contextlib.ExitStack() as stack:
            for installer in self.installers:
                stack.enter_context(installer.install(self))
            return loss(model, batch)


def _input_cast(run: ForwardRun) -> ContextManager[None]:
    return casting_inputs(run.model, run.layout.param_dtype if run.layout else None)


def _tensor_parallel(run: ForwardRun) -> ContextManager[None]:
    layout = run.layout
    styles = dict(layout.tp_styles) if layout is not None else {}
    if layout is None or not styles or tp_installed(run.model, styles):  # already there
        return _NOTHING
    return tensor_parallel.parallel_forwards(run.model, styles, layout.tp_group)


def _gather_at_use(run: ForwardRun) -> ContextManager[None]:
    return reshard.gathering_at_use(run.inflight)


def _gather_modules(run: ForwardRun) -> ContextManager[None]:
    return reshard.gathering_modules(run.inflight)


# name -> `run -> context manager`, for the names of LAYOUT_INSTALLERS and of
# RECOMPUTE_INSTALLERS (fixed tables, not registries: nothing adds to them)
_LAYOUT = {
    "input_cast": _input_cast,
    "tensor_parallel": _tensor_parallel,
    "gather_at_use": _gather_at_use,
}
_RECOMPUTE = {"tensor_parallel": _tensor_parallel, "gather_at_use": _gather_modules}
