"""The one-cycle policy (Smith & Topin), with torch's `OneCycleLR` formulas: lr and momentum.

`one_cycle` is the learning-rate *multiplier* of `max_lr` (multiply it by `max_lr`, as with every
functrain schedule); `one_cycle_momentum` is the momentum (SGD's `momentum`, Adam's `b1`) itself,
cycled inversely to the lr. Both take the same shape arguments, so a pair built from the same
arguments reproduces `torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr, total_steps, ...)`
with `cycle_momentum=True` at every step.

With `N` = `t_max` in batches (torch's `total_steps`), `initial = 1 / div_factor` and
`minimum = initial / final_div_factor`, the phases end at these steps (as in torch):

- two phases: `pct_start * N - 1` (initial -> 1), then `N - 1` (1 -> minimum);
- `three_phase`: `pct_start * N - 1` (initial -> 1), `2 * pct_start * N - 2` (1 -> initial),
  `N - 1` (initial -> minimum).

Within a phase `pct = (t - phase start) / (phase end - phase start)` anneals from its start value
to its end value by half a cosine (`anneal_strategy="cos"`) or a straight line (`"linear"`). The
momentum goes max -> base while the lr rises and base -> max while it falls (and holds at max in
the third phase). Unlike torch, `pct` is clipped to [0, 1]: after `N - 1` the schedule holds its
last value instead of turning back up, and a zero-length phase is at its end value (torch
divides by zero there).

Example:
    >>> lr, mom = 0.1 * one_cycle("100ba"), one_cycle_momentum("100ba")
    >>> round(lr(0), 6), lr(29), round(lr(99), 10), mom(0), mom(29)
    (0.004, 0.1, 4e-07, 0.95, 0.85)

Wire them into an optimizer with `inject_hyperparams`: for SGD,
`inject_hyperparams(sgd)(lr=0.1 * one_cycle("1dur"), momentum=one_cycle_momentum("1dur"))`;
for Adam's `b1` (inside the static `betas` tuple of `adamw`), chain the pieces:
`chain(inject_hyperparams(scale_by_adam)(b1=one_cycle_momentum("1dur"), b2=0.999),
add_decayed_weights(0.01), inject_hyperparams(scale_by_learning_rate)(lr=1e-2 * one_cycle("1dur")))`
(AdamW's decay is multiplied by the lr, which `scale_by_learning_rate` does after it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from ..units import TimeLike, Timestamp
from .base import Schedule, _clip01, _number, _on_axis, _schedule_time

__all__ = ["OneCycleSchedule", "OneCycleMomentumSchedule", "one_cycle", "one_cycle_momentum"]

_STRATEGIES = ("cos", "linear")


def _anneal(strategy: str, start: float, end: float, pct: float) -> float:
    """From `start` (pct 0) to `end` (pct 1), written as torch writes it (same rounding)."""
    if strategy == "cos":
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
    return (end - start) * pct + start


def _phase(total: float, now: float, pct_start: float, three_phase: bool) -> tuple[int, float]:
    """`(phase index, pct within it)` at step `now` of a `total`-step cycle (torch's search)."""
    ends = [pct_start * total - 1, total - 1]
    if three_phase:
        ends.insert(1, 2 * pct_start * total - 2)
    start = 0.0
    for i, end in enumerate(ends):
        if now <= end or i == len(ends) - 1:
            length = end - start
            return i, 1.0 if length == 0 else _clip01((now - start) / length)
        start = end
    raise AssertionError("unreachable: the last phase always matches")


@dataclasses.dataclass(frozen=True)
class _OneCycleShape(Schedule):
    """The fields and checks the lr and momentum schedules share."""

    t_max: TimeLike = "1dur"
    pct_start: float = 0.3
    anneal_strategy: str = "cos"
    three_phase: bool = False

    def __post_init__(self):
        object.__setattr__(self, "t_max", _schedule_time(self.t_max, "t_max", positive=True))
        pct = _number(self.pct_start, "pct_start", minimum=0.0)
        if pct > 1.0:
            raise ValueError(
                f"pct_start is the fraction of the cycle spent rising, in [0, 1]; got {pct}"
            )
        object.__setattr__(self, "pct_start", pct)
        if self.anneal_strategy not in _STRATEGIES:
            raise ValueError(
                f"anneal_strategy must be 'cos' or 'linear' (as in torch), got {self.anneal_strategy!r}"
            )
        if not isinstance(self.three_phase, bool):
            raise TypeError(f"three_phase must be a bool, got {self.three_phase!r}")

    def _where(self, ts: Timestamp) -> tuple[int, float]:
        now, total = _on_axis(ts, self.t_max)  # type: ignore[arg-type]
        return _phase(total, now, self.pct_start, self.three_phase)


@dataclasses.dataclass(frozen=True)
class OneCycleSchedule(_OneCycleShape):
    """The one-cycle lr, as a multiplier of `max_lr`: `1 / div_factor` -> 1 -> the minimum.

    Args:
        t_max: the cycle's length (torch's `total_steps`), e.g. "1dur" or "1000ba".
        pct_start: the fraction of the cycle spent raising the lr.
        anneal_strategy: "cos" or "linear".
        three_phase: fall back to the initial lr before the final annealing (fastai's variant).
        div_factor: the initial multiplier is `1 / div_factor`.
        final_div_factor: the last multiplier is `1 / (div_factor * final_div_factor)`.
    Example:
        >>> s = one_cycle("10ba", pct_start=0.5, anneal_strategy="linear", div_factor=10.0)
        >>> s(0), s(4)
        (0.1, 1.0)
    """

    name: ClassVar[str] = "one_cycle"
    div_factor: float = 25.0
    final_div_factor: float = 1e4

    def __post_init__(self):
        super().__post_init__()
        for field in ("div_factor", "final_div_factor"):
            value = _number(getattr(self, field), field, minimum=0.0, strict=True)
            object.__setattr__(self, field, value)

    def at(self, ts: Timestamp) -> float:
        initial = 1.0 / self.div_factor
        minimum = initial / self.final_div_factor
        ends = [(initial, 1.0), (1.0, initial), (initial, minimum)]
        if not self.three_phase:
            ends = [(initial, 1.0), (1.0, minimum)]
        phase, pct = self._where(ts)
        return _anneal(self.anneal_strategy, *ends[phase], pct)


@dataclasses.dataclass(frozen=True)
class OneCycleMomentumSchedule(_OneCycleShape):
    """The one-cycle momentum (absolute): `max_momentum` -> `base_momentum` -> `max_momentum`.

    Give it the same `t_max`, `pct_start`, `anneal_strategy` and `three_phase` as the lr's
    `one_cycle`. It is the value itself (a momentum, or Adam's `b1`), not a multiplier.

    Args:
        t_max, pct_start, anneal_strategy, three_phase: as in `one_cycle`.
        base_momentum: the momentum at the lr's peak.
        max_momentum: the momentum at the start and the end of the cycle.
    Example:
        >>> m = one_cycle_momentum("10ba", pct_start=0.5, anneal_strategy="linear")
        >>> m(0), m(4), m(9)
        (0.95, 0.85, 0.95)
    """

    name: ClassVar[str] = "one_cycle_momentum"
    base_momentum: float = 0.85
    max_momentum: float = 0.95

    def __post_init__(self):
        super().__post_init__()
        for field in ("base_momentum", "max_momentum"):
            value = _number(getattr(self, field), field, minimum=0.0)
            if value >= 1.0:
                raise ValueError(f"{field} must be in [0, 1) (it is a decay rate), got {value}")
            object.__setattr__(self, field, value)

    def at(self, ts: Timestamp) -> float:
        low, high = self.base_momentum, self.max_momentum
        ends = [(high, low), (low, high), (high, high)]
        if not self.three_phase:
            ends = [(high, low), (low, high)]
        phase, pct = self._where(ts)
        return _anneal(self.anneal_strategy, *ends[phase], pct)


one_cycle = OneCycleSchedule
one_cycle_momentum = OneCycleMomentumSchedule
