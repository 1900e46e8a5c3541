"""`NaNMonitor`: stop the run when the loss (or another metric) stops being finite.

Checking a device value on every step would make the host wait for the device on every step. So
each step only *records*, on the device, the first step at which each watched metric went bad
(a `torch.where`, no transfer); the host reads that record on the loop's logging steps (or the
monitor's own interval) and at the end of every epoch and of the run. The message names the exact
step even though it is read later.

On several ranks the check is global: a metric that went bad on any rank (a per-rank auxiliary
metric, say) trips the monitor on every rank at the same check, with the same step, so the ranks
stop or raise together instead of one rank leaving the others waiting in a collective.

Example:
    >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[NaNMonitor()])  # doctest: +SKIP
    NonFiniteError: 'loss' is nan at step 17 (epoch 0, batch 17 of the epoch) ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..units import TimeLike
from .interval import LogCadence


class NonFiniteError(FloatingPointError):
    """A watched training metric became NaN or infinite."""


_NEVER = 2**62  # "no bad step yet", as a number the minimum over ranks ignores


def _earliest_over_ranks(steps: list[int]) -> list[int]:
    """Each metric's first bad step over all ranks (-1: none); the list itself on one process."""
    import torch.distributed as dist

    if not steps or not (dist.is_available() and dist.is_initialized()):
        return steps
    if dist.get_world_size() == 1:
        return steps
    local = torch.tensor([s if s >= 0 else _NEVER for s in steps], dtype=torch.int64)
    if dist.get_backend() == "nccl":  # NCCL alone cannot reduce a CPU tensor
        local = local.cuda()
    dist.all_reduce(local, op=dist.ReduceOp.MIN)  # every rank checks at the same steps
    return [s if s != _NEVER else -1 for s in local.tolist()]


class NaNMonitor:
    """Raise (or stop the loop) when a watched metric is NaN or infinite.

    Args:
        monitor: metric keys to watch (missing keys are ignored); "loss" and "grad_norm" by
            default, since a non-finite gradient corrupts the parameters before the loss shows it.
        action: "raise" raises `NonFiniteError`; "stop" asks the loop to stop with the message.
        interval: when the host checks; None follows the loop's logging interval ("10ba" when
            the loop does not log). "1ba" checks every step (one synchronisation per step).
    """

    def __init__(
        self,
        monitor: Sequence[str] = ("loss", "grad_norm"),
        action: str = "raise",
        interval: TimeLike | None = None,
    ):
        if action not in ("raise", "stop"):
            raise ValueError(f"NaNMonitor action must be 'raise' or 'stop', got {action!r}")
        self.monitor = (monitor,) if isinstance(monitor, str) else tuple(monitor)
        self.action = action
        self.cadence = LogCadence(interval, when_loop_silent="10ba")
        # Per metric, on its device: the first bad step (-1: none yet) and the value seen then.
        self._first_step: dict[str, torch.Tensor] = {}
        self._first_value: dict[str, torch.Tensor] = {}
        self._epoch_of: dict[int, tuple[int, int]] = {}
        self.tripped: str | None = None

    def _record(self, key: str, value: Any, step: int) -> None:
        value = torch.as_tensor(value).detach()
        if value.is_floating_point() or value.is_complex():
            bad = ~torch.isfinite(value).all()
        else:
            return  # integers are always finite
        first = self._first_step.get(key)
        if first is None:
            first = torch.full((), -1, dtype=torch.int64, device=value.device)
            self._first_value[key] = torch.zeros((), dtype=torch.float64, device=value.device)
        new = bad & (first < 0)
        self._first_step[key] = torch.where(new, torch.full_like(first, step), first)
        # The sum of a tensor holding a NaN or an inf is NaN or inf: what to show, sync-free.
        shown = value.to(torch.float64).sum()
        self._first_value[key] = torch.where(new, shown, self._first_value[key])

    def batch_end(self, ctx: Any) -> None:
        if self.tripped:
            return
        metrics = ctx.metrics or {}
        step = int(ctx.state.step)
        ts = ctx.timestamp
        # Host-side note of where each step sits in its epoch, for the message.
        self._epoch_of[step] = (ts.epoch, ts.batch_in_epoch)  # emptied by each clean check
        for key in self.monitor:
            if key in metrics and metrics[key] is not None:
                self._record(key, metrics[key], step)
        if self.cadence.due(ctx):
            self.check(ctx)

    def epoch_end(self, ctx: Any) -> None:
        self.check(ctx)

    def fit_end(self, ctx: Any) -> None:
        self.check(ctx)

    def check(self, ctx: Any = None) -> None:
        """Read the record (one synchronisation) and act if a metric went bad."""
        if self.tripped or not self._first_step:
            return
        keys, steps = [], []
        by_device: dict[torch.device, list[str]] = {}
        for key, first in self._first_step.items():
            by_device.setdefault(first.device, []).append(key)
        for group in by_device.values():  # one host read per device
            keys += group
            steps += torch.stack([self._first_step[k] for k in group]).tolist()
        mine = dict(zip(keys, steps))
        steps = _earliest_over_ranks(steps)
        bad = [
            (step, index, key) for index, (key, step) in enumerate(zip(keys, steps)) if step >= 0
        ]
        if not bad:
            self._epoch_of.clear()  # a later first bad step can only be a later step
            return
        step, _, key = min(bad)  # the earliest step; monitor order breaks ties
        if mine[key] == step:
            value: Any = float(self._first_value[key])
        else:
            value = "non-finite on another rank"
        epoch, batch_in_epoch = self._epoch_of.get(step, (None, None))
        where = (
            f" (epoch {epoch}, batch {batch_in_epoch} of the epoch)" if epoch is not None else ""
        )
        self.tripped = (
            f"NaNMonitor: {key!r} is {value} at step {step}{where}. Training diverged: lower the "
            "learning rate, clip gradients (functrain.optim.clip_by_global_norm), check the data "
            "for NaN/inf, or skip such steps with make_step(..., skip_nonfinite=True)."
        )
        if self.action == "raise" or ctx is None:
            raise NonFiniteError(self.tripped)
        ctx.request_stop(self.tripped)
