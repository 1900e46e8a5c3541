"""Activation checkpointing: chosen blocks keep only their inputs; backward recomputes the rest.

`activation_checkpointing(Block)` adds an installer to the step's forward run
(`step.forward_run`, innermost of all). While the loss runs, each chosen module is called through `torch.utils.checkpoint.checkpoint` (non-reentrant): the forward pass
keeps the module's inputs, not its intermediate activations, and the backward pass runs the
module again to get them back. Nothing is stored in the state and the model is not changed
(the module is swapped for a parameterless stand-in in its parent only while the loss runs), so
a run resumes exactly and checkpoints are the same with and without it.

Three things make the recomputation see what the forward pass saw:

- the tensors: the step runs the model under `torch.func.functional_call`, which has put the
  state's tensors back by the time the backward pass recomputes. The stand-in records the
  module's parameters and buffers at forward time and installs them again for the
  recomputation (buffers as copies: BatchNorm's running statistics are updated once, not twice);
- the layout: the recomputation runs in the backward pass, after the forward run removed what
  it installed, so it installs again what acts when a module is called
  (`ForwardRun.recomputing`): the tensor-parallel forwards, and under
  `fsdp(reshard_after_forward=True)` the module hooks that gather the parameters (this rank's
  shards, "placeholders") again; the gradients still flow through the forward pass's gathers,
  so each bucket is reduced once;
- random numbers: checkpoint restores the global generator to its state at forward time
  (`preserve_rng_state`); the step seeds that generator from the run's counter-based key, so
  dropout draws the same mask twice, and a resumed run the same masks as an uninterrupted one.

Example:
    >>> algorithm = activation_checkpointing("Block")                  # every GPT block
    >>> algorithm = activation_checkpointing("Block", every=2)         # every 2nd block
    >>> algorithm = activation_checkpointing(names="blocks.*", policy="selective")
    >>> step = functrain.compose(functrain.make_step(model, gpt_loss, opt), algorithm)
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
from collections.abc import Callable, Iterable, Iterator

import torch
from torch.utils import checkpoint as torch_checkpoint

from .. import _torch
from ..step import Algorithm, StepPieces
from ..step.forward_run import ForwardRun, Installer

POLICIES = ("full", "selective")

_aten = torch.ops.aten
MATMUL_OPS = frozenset((_aten.mm.default, _aten.addmm.default, _aten.bmm.default))
ATTENTION_OPS = _torch.attention_kernel_ops()


def selective_policy(save_ops: Iterable | None = None) -> Callable:
    """A fresh per-op decision of selective checkpointing for one checkpointed call (for
    `torch.utils.checkpoint.create_selective_checkpoint_contexts`).

    Default (`save_ops=None`, torchtitan's rule): keep the outputs of attention and of every
    second matmul, counted within the module's call (the recomputation counts its own calls
    alike, so both agree), and recompute the rest — the other matmuls and every cheap
    elementwise op (norms, activations, dropout, adds). With `save_ops`: keep exactly those ops'
    outputs.
    """
    must_save, recompute = (
        torch_checkpoint.CheckpointPolicy.MUST_SAVE,
        torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE,
    )
    if save_ops is not None:
        keep = frozenset(save_ops)

        def chosen(ctx, op, *args, **kwargs):
            return must_save if op in keep else recompute

        return chosen
    # Counted per pass: this torch decides in the forward pass only (the recomputation replays
    # the decisions by position); versions that ask again while recomputing count alike.
    matmuls = {False: 0, True: 0}

    def torchtitan_rule(ctx, op, *args, **kwargs):
        if op in ATTENTION_OPS:
            return must_save
        if op in MATMUL_OPS:
            matmuls[ctx.is_recompute] += 1
            return must_save if matmuls[ctx.is_recompute] % 2 == 1 else recompute
        return recompute

    return torchtitan_rule


def _selective_contexts(save_ops):
    return torch_checkpoint.create_selective_checkpoint_contexts(selective_policy(save_ops))


def module_matcher(target, names) -> Callable[[str, torch.nn.Module], bool]:
    if target is None and names is None:
        raise ValueError(
            "activation_checkpointing needs to know which modules to recompute: give a class or "
            "class name (activation_checkpointing('Block')), a tuple of them, a function "
            "(name, module) -> bool, or names='blocks.*' (fnmatch patterns of module names)"
        )
    if callable(target) and not isinstance(target, type):
        check = target
    else:
        targets = target if isinstance(target, tuple) else (() if target is None else (target,))
        for t in targets:
            if not isinstance(t, (str, type)):
                raise TypeError(
                    f"activation_checkpointing target must be a module class or class name, "
                    f"got {t!r}"
                )
        classes = tuple(t for t in targets if isinstance(t, type))
        class_names = frozenset(t for t in targets if isinstance(t, str))

        def check(name: str, module: torch.nn.Module) -> bool:
            return isinstance(module, classes) or type(module).__name__ in class_names

    patterns = (names,) if isinstance(names, str) else tuple(names or ())

    def matches(name: str, module: torch.nn.Module) -> bool:
        if patterns and any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return True
        return (target is not None) and bool(check(name, module))

    return matches


def chosen_modules(model: torch.nn.Module, matches, every: int = 1) -> list[str]:
    """The qualified names of the modules to recompute: the outermost matches (a match inside
    another is covered by it), then every `every`-th of them, counting from 1 (torchtitan's
    `ac_freq`: with every=2 the 2nd, 4th, ... blocks)."""
    found: list[str] = []
    for name, module in named_real_modules(model):
        if not name or any(name.startswith(outer + ".") for outer in found):
            continue
        if matches(name, module):
            found.append(name)
    return [name for i, name in enumerate(found, start=1) if i % every == 0]


class StandIn(torch.nn.Module):
    """A parameterless module standing in for `inner` in its parent while the loss runs.

    `inner` is held outside `_modules`, so the stand-in has no parameters of its own and the
    hooks that gather parameters at use see only `inner`'s. Stand-ins nest (offload around
    checkpointing); `real_module` finds the module they stand for.
    """

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "inner", inner)
        self.training = inner.training

    def __getattr__(self, name: str):
        # a parent may read its child's attributes (`block.n_head`): they are the module's
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["inner"], name)


def real_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module behind any stand-ins."""
    while isinstance(module, StandIn):
        module = module.inner
    return module


def named_real_modules(model: torch.nn.Module, prefix: str = ""):
    """`named_modules()` seeing through stand-ins (another algorithm's, installed first)."""
    model = real_module(model)
    yield prefix, model
    for name, child in _torch.child_slots(model).items():
        if child is not None:
            yield from named_real_modules(child, f"{prefix}.{name}" if prefix else name)


def parent_of(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """`(parent, child)` of the qualified `name`, seeing through stand-ins."""
    *path, child = name.split(".")
    parent = real_module(model)
    for part in path:
        found = _torch.child_slots(parent)[part]
        if found is None:
            raise ValueError(f"{name!r}: its parent {part!r} is None, not a module")
        parent = real_module(found)
    return parent, child


def wrap_innermost(parent: torch.nn.Module, child: str, make: Callable) -> Callable[[], None]:
    """Put `make(module)` where `parent.<child>` is called, inside any stand-ins already there
    (recomputation runs innermost, so that offloading's hooks stay outside checkpoint's).
    Returns the function that undoes it."""
    children = _torch.child_slots(parent)
    slot = children[child]
    if not isinstance(slot, StandIn):
        children[child] = make(slot)
        return lambda: children.__setitem__(child, slot)
    holder = slot
    while isinstance(holder.inner, StandIn):
        holder = holder.inner
    inner = holder.inner
    object.__setattr__(holder, "inner", make(inner))
    return lambda: object.__setattr__(holder, "inner", inner)


class _Recomputed(StandIn):
    """Calls `inner` under checkpoint (see the module docstring)."""

    def __init__(self, inner: torch.nn.Module, context_fn: Callable | None, run=None):
        super().__init__(inner)
        object.__setattr__(self, "make_contexts", context_fn)
        object.__setattr__(self, "run", run)  # the step's ForwardRun (None: nothing to redo)
        # Decided here, outside any compiled region (a plain bool for dynamo to guard on): a
        # module that gathers its parameters at use cannot be traced (see `forward`).
        object.__setattr__(self, "traceable", run is None or run.gathered_at_use is None)
        # Stand-ins are made outside any compiled region, before it starts. torch.compiler's
        # `disable` imports dynamo (seconds), which `import functrain` must not pay: wrap only
        # once dynamo is loaded, as it is before compile_step traces anything.
        untraced = _never_traced() if _torch.dynamo_loaded() else _eager_checkpoint
        object.__setattr__(self, "eager", untraced)

    def forward(self, *args, **kwargs):
        inner = self.inner
        if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
            return inner(*args, **kwargs)
        if torch.compiler.is_compiling() and self.traceable:
            # compile_step: AOTAutograd recomputes inside the compiled backward, with the graph's
            # own inputs; the tensors and hooks of the eager path are not needed (or traceable).
            if self.make_contexts is None:
                return torch_checkpoint.checkpoint(inner, *args, use_reentrant=False, **kwargs)
            return torch_checkpoint.checkpoint(
                inner, *args, use_reentrant=False, context_fn=self.make_contexts, **kwargs
            )
        return self.eager(self, *args, **kwargs)


def _eager_checkpoint(stand_in: _Recomputed, *args, **kwargs):
    """The checkpoint of the eager step, never traced. Under `compile_step` the gathers at
    use break dynamo's trace of the block, and dynamo then runs torch's checkpoint eagerly
    from the traced branch: its recomputation, in the backward pass, ran with the model's
    own tensors in the slots (the forward's are gone by then) and without the gathering
    hooks ("native_layer_norm got mixed torch.Tensor and DTensor"). Here it gets both."""
    inner = stand_in.inner
    tensors = _module_tensors(inner)
    run = stand_in.run
    make_contexts = stand_in.make_contexts

    def contexts():
        forward_ctx, recompute_ctx = (
            make_contexts()
            if make_contexts
            else (contextlib.nullcontext(), contextlib.nullcontext())
        )
        return forward_ctx, _recomputing(tensors, run, recompute_ctx)

    return torch_checkpoint.checkpoint(
        inner, *args, use_reentrant=False, context_fn=contexts, **kwargs
    )


@functools.cache
def _never_traced() -> Callable:
    """`_eager_checkpoint`, which dynamo runs eagerly instead of tracing (made once, on first use)."""
    return torch.compiler.disable(_eager_checkpoint)


def _module_tensors(module: torch.nn.Module) -> list[tuple[dict, str, torch.Tensor, bool]]:
    """`(owner's dict, name, tensor, is_buffer)` for every parameter and buffer under `module`,
    as they are now (the tensors `functional_call` or a gather at use installed)."""
    out: list[tuple[dict, str, torch.Tensor, bool]] = []
    for sub in module.modules():
        params, buffers = _torch.parameter_slots(sub), _torch.buffer_slots(sub)
        for name, tensor in params.items():
            if tensor is not None:
                out.append((params, name, tensor, False))
        for name, buffer in buffers.items():
            if buffer is not None:
                out.append((buffers, name, buffer, True))
    return out


@contextlib.contextmanager
def _recomputing(tensors, run, inner_ctx) -> Iterator[None]:
    """The forward pass's tensors installed again, and what the run installs for a
    recomputation (tensor-parallel forwards, gathering at use)."""
    previous = [(owner, name, owner[name]) for owner, name, _, _ in tensors]
    try:
        for owner, name, tensor, is_buffer in tensors:
            owner[name] = tensor.clone() if is_buffer else tensor
        with run.recomputing() if run is not None else contextlib.nullcontext(), inner_ctx:
            yield
    finally:
        for owner, name, tensor in previous:
            owner[name] = tensor


@contextlib.contextmanager
def recomputing_modules(
    model: torch.nn.Module,
    names: list[str],
    context_fn: Callable | None = None,
    run: ForwardRun | None = None,
) -> Iterator[None]:
    """While active, the modules of `model` named in `names` run under checkpoint.

    Args:
        model: the model the loss calls.
        names: qualified module names (`chosen_modules`).
        context_fn: `() -> (forward_ctx, recompute_ctx)` (selective checkpointing), or None.
        run: the step's `ForwardRun`, whose layout the recomputation installs again (None:
            nothing to install again).
    """
    undo = []
    try:
        for name in names:
            parent, child = parent_of(model, name)
            undo.append(wrap_innermost(parent, child, lambda m: _Recomputed(m, context_fn, run)))
        yield
    finally:
        for restore in reversed(undo):
            restore()


def refuse_functorch(name: str) -> None:
    """A clear error under `torch.func.grad` (`make_step(grad_mode="func")`)."""
    if _torch.under_functorch_grad():
        raise ValueError(
            f"{name} works through autograd's saved-tensor hooks, which torch.func.grad does "
            "not support; build the step with make_step(..., grad_mode='autograd') (the default)"
        )


def activation_checkpointing(
    target=None,
    *,
    names: str | Iterable[str] | None = None,
    every: int = 1,
    policy: str = "full",
    save_ops: Iterable | None = None,
) -> Algorithm:
    """Recompute chosen modules' activations in the backward pass instead of keeping them.

    Args:
        target: the modules to recompute: a class, a class name ("Block"), a tuple of them, or a
            function `(qualified_name, module) -> bool`. Matches inside a match are covered by
            it (only the outermost is checkpointed).
        names: fnmatch patterns of qualified module names ("blocks.*"), alone or beside `target`.
        every: checkpoint every `every`-th matched module (1: all; 2: the 2nd, 4th, ...).
        policy: "full" (keep only each module's inputs) or "selective" (also keep the outputs
            of the expensive ops, recompute the cheap ones).
        save_ops: the aten ops whose outputs selective checkpointing keeps (default:
            torchtitan's rule, attention and every second matmul; see `selective_policy`).
    Returns:
        the `Algorithm` "activation_checkpointing" (no state; exactly resumable).
    Example:
        >>> step = functrain.compose(step, activation_checkpointing(Block, every=2))
    """
    matches = module_matcher(target, names)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive int (1: every matched module), got {every!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if save_ops is not None and policy != "selective":
        raise ValueError("save_ops is for policy='selective'; drop it or set policy='selective'")
    context_fn = None
    if policy == "selective":
        save = None if save_ops is None else frozenset(save_ops)
        # a partial of a module-level function: a form torch.compile accepts as a context_fn
        context_fn = functools.partial(_selective_contexts, save)

    def install(run: ForwardRun) -> contextlib.AbstractContextManager[None]:
        refuse_functorch("activation_checkpointing")
        module = run.model
        # A walk over the module names per call (no cache keyed by object identity).
        names_here = chosen_modules(module, matches, every)
        if not names_here:
            raise ValueError(
                "activation_checkpointing matched no module of "
                f"{type(module).__name__}; check target/names (module names look "
                f"like {[n for n, _ in module.named_modules() if n][:4]})"
            )
        return recomputing_modules(module, names_here, context_fn, run)

    installer = Installer("activation_checkpointing", install)

    def apply(pieces: StepPieces) -> StepPieces:
        return pieces._replace(installers=(*pieces.installers, installer))

    return Algorithm(name="activation_checkpointing", apply=apply)
