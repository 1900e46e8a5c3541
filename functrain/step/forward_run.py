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
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..parallel.running import LAYOUT_ORDER, recomputing, running

if TYPE_CHECKING:
    from ..parallel import InFlight
    from ..parallel.layout import Layout

# Outermost first; see the module docstring for why. The layout's part is `parallel.running`'s.
ORDER = (*LAYOUT_ORDER, "slots", "offload", "activation_checkpointing")
LOSS_INSTALLERS = ORDER[ORDER.index("slots") + 1 :]  # entered by `ForwardRun.call_loss`


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
        """The layout's installers (`parallel.running.LAYOUT_ORDER`) for the block's length."""
        return running(self.model, self.layout, self.inflight)

    def recomputing(self) -> ContextManager[None]:
        """The layout's installers a recomputation needs (`parallel.running.RECOMPUTE_ORDER`),
        for activation checkpointing to enter around it in the backward pass."""
        return recomputing(self.model, self.layout, self.inflight)

    def call_loss(self, model: Any, loss: Callable, batch: Any) -> Any:
        """`loss(model, batch)` under the algorithms' installers (`LOSS_INSTALLERS`), which run
        inside the slots: call it with the state's tensors already in the model."""
        if not self.installers:
            return loss(model, batch)
        with contextlib.ExitStack() as stack:
            for installer in self.installers:
                stack.enter_context(installer.install(self))
            return loss(model, batch)
