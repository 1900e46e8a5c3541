"""What a step decides once about the states it is given, instead of on every call.

A step called in a loop sees the state it produced on the previous call. Checking that state's
optimizer state against the parameters, finding where its learning rate is kept, and choosing how
to take the gradient norm depend only on its structure and its tensors' kinds, so a `Plans`
cache decides them when a state arrives that the step did not produce (the first state, a restored
checkpoint, a hand-made one), and reuses the decision while the step is fed its own outputs.

Recognising "its own output" costs one attribute path and an identity test: the plan keeps a weak
reference to the first tensor of the optimizer state the step returned (nothing is kept alive).
The same test (`Plans.own`) spares a guarded step the walk that turns its optimizer's update
counts into tensors: its own outputs have them so already (`functrain.step.guards`).

Example:
    >>> plans = Plans()
    >>> plan = plans.plan_for(state.opt_state, trainable_params)   # checks, once
    >>> plans.produced(new_state.opt_state, plan)                   # remembers the output
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple

import optree
import torch

from ..optim import current_lr
from ..optim._foreach import is_dtensor
from ..optim.hyperparams import LR_NAMES
from ..tree import NAMESPACE, key_to_str
from .checks import check_opt_state

_LOOKUP_ERRORS = (KeyError, IndexError, AttributeError, TypeError, ValueError)


class StatePlan(NamedTuple):
    """The decisions a step made for states of one structure.

    Attributes:
        first_tensor: `opt_state -> Tensor | None`, the optimizer state's first tensor (what
            recognises the step's own output), or None for a state without tensors.
        read_lr: `opt_state -> float | None`, the learning rate last used.
        plain_grads: every trainable parameter is a plain tensor of one dtype and device, so the
            gradient norm is one foreach kernel and a norm (else `optim.global_norm`).
    """

    first_tensor: Callable[[Any], torch.Tensor | None]
    read_lr: Callable[[Any], float | None]
    plain_grads: bool


class Plans:
    """A step's plans by state structure, and which one its last output had (a cache only)."""

    def __init__(self):
        self._by_key: dict[Hashable, StatePlan] = {}
        self._last: tuple[weakref.ref, StatePlan] | None = None

    def plan_for(
        self,
        opt_state: Any,
        params: Callable[[], Mapping[str, torch.Tensor]],
        layout: Any = None,
    ):
        """The plan for `opt_state`; checks it against `params()` unless the step produced it.

        Args:
            opt_state: the optimizer state the step was given.
            params: `() -> {name: tensor}` of the trainable parameters (called only to check).
            layout: the parameters' layout (`state.layout`; offloaded parameters belong on the
                host).
        Raises:
            ValueError: the optimizer state does not fit the parameters (see `check_opt_state`).
        """
        plan = self.own(opt_state)
        if plan is not None:
            return plan
        trainable = params()
        plain = _plain(trainable)
        key = (optree.tree_structure(opt_state, namespace=NAMESPACE), plain)
        plan = self._by_key.get(key)
        if plan is None:
            plan = self._by_key[key] = _build(opt_state, plain)
        if plan.first_tensor(opt_state) is not None:
            check_opt_state(opt_state, trainable, layout)
        return plan

    def own(self, opt_state: Any) -> StatePlan | None:
        """The plan of the step's last output when `opt_state` is that output (its first tensor
        is the one the step returned), else None: a state the step has not decided on."""
        last = self._last
        if last is None:
            return None
        ref, plan = last
        tensor = plan.first_tensor(opt_state)
        return plan if tensor is not None and tensor is ref() else None

    def produced(self, opt_state: Any, plan: StatePlan) -> None:
        """Remember that the step returned `opt_state` (checked: it came from a checked one)."""
        tensor = plan.first_tensor(opt_state)
        self._last = None if tensor is None else (weakref.ref(tensor), plan)


def _plain(params: Mapping[str, torch.Tensor]) -> bool:
    tensors = list(params.values())
    if not tensors or any(type(t) is not torch.Tensor for t in tensors):
        return False
    first = tensors[0]
    return all(t.dtype == first.dtype and t.device == first.device for t in tensors)


def _build(opt_state: Any, plain: bool) -> StatePlan:
    accessors, leaves, _ = optree.tree_flatten_with_accessor(opt_state, namespace=NAMESPACE)
    first = next((a for a, leaf in zip(accessors, leaves) if isinstance(leaf, torch.Tensor)), None)
    return StatePlan(_reader(first), _lr_reader(opt_state, accessors, leaves), plain)


def _reader(accessor: Any) -> Callable[[Any], Any]:
    if accessor is None:
        return lambda tree: None
    walk = _path_reader(accessor)

    def read(tree: Any) -> Any:
        try:
            return walk(tree)
        except _LOOKUP_ERRORS:  # another structure: not this plan's
            return None

    return read


def _path_reader(accessor: Any) -> Callable[[Any], Any]:
    """`accessor(tree)` for an optree accessor, through C-level getters, one per entry: the same
    reads without a Python frame per entry (this runs on every step). Entries of other kinds
    are called as they are."""
    getters = tuple(
        operator.itemgetter(entry.entry)
        if isinstance(entry, optree.GetItemEntry)
        else operator.attrgetter(entry.name)  # a dotted name reads attribute by attribute
        if isinstance(entry, optree.GetAttrEntry)
        else entry
        for entry in accessor
    )

    def walk(tree: Any) -> Any:
        for get in getters:
            tree = get(tree)
        return tree

    return walk


def _lr_reader(opt_state: Any, accessors: list, leaves: list) -> Callable[[Any], float | None]:
    """Where `current_lr` finds the learning rate, as a path read in O(1) on later states."""
    value = current_lr(opt_state)
    if value is None:
        return current_lr
    for accessor, leaf in zip(accessors, leaves):
        name = key_to_str(accessor[-1]) if len(accessor) else ""
        if name in LR_NAMES and not is_dtensor(leaf) and _float(leaf) == value:
            return _fallback_reader(accessor)
    return current_lr  # the value is not one leaf's: keep searching each time


def _fallback_reader(accessor: Any) -> Callable[[Any], float | None]:
    walk = _path_reader(accessor)

    def read_lr(opt_state: Any) -> float | None:
        try:
            return float(walk(opt_state))
        except _LOOKUP_ERRORS:
            return current_lr(opt_state)

    return read_lr


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except _LOOKUP_ERRORS + (RuntimeError,):
        return None
