"""`LRMonitor`: log the learning rate the optimizer last used.

The rate is a Python float in the optimizer state (`inject_hyperparams` keeps hyperparameters as
data), so reading it never touches the device. With several rates in the state (parameter groups
built with `masked`/`chain`), each is logged under its path in the state as well.

Example:
    >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[LRMonitor()])  # doctest: +SKIP
    # logs {"lr": 0.001} on each logging step
"""

from __future__ import annotations

import numbers
from typing import Any

from ..tree import leaves_with_paths
from ..units import TimeLike
from .interval import LogCadence

_LR_NAMES = ("lr", "learning_rate")


def learning_rates(opt_state: Any) -> dict[str, float]:
    """Every learning rate stored in an optimizer state, by its dotted path.

    Args:
        opt_state: `state.opt_state`.
    Returns:
        `{path: lr}` for each leaf named "lr" or "learning_rate" holding a Python number.
    """
    found = {}
    for path, leaf in leaves_with_paths(opt_state):
        last = path.rsplit(".", 1)[-1]
        if last in _LR_NAMES and isinstance(leaf, numbers.Real) and not isinstance(leaf, bool):
            found[path] = float(leaf)
    return found


class LRMonitor:
    """Log the learning rate as "lr" (and "lr/<path>" for each of several rates).

    Args:
        interval: when to log; None follows the loop's logging interval.
    """

    def __init__(self, interval: TimeLike | None = None):
        self.cadence = LogCadence(interval)

    def batch_end(self, ctx: Any) -> None:
        if not self.cadence.due(ctx):
            return
        rates = learning_rates(ctx.state.opt_state)
        values: dict[str, float] = {}
        lr = (ctx.metrics or {}).get("lr")
        if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
            values["lr"] = float(lr)
        elif rates:
            values["lr"] = next(iter(rates.values()))
        if len(rates) > 1:
            values.update({f"lr/{path}": rate for path, rate in rates.items()})
        if values:
            ctx.log(values)
