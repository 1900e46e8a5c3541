"""Covering arrays: few rows in which every t-tuple of axis values meets at least once.

A scenario matrix over k axes is too big to run whole (7 axes of 2 to 7 values here: 7,560 rows),
but most bugs need only two features to meet. A covering array of strength 2 (pairwise) holds
every pair of values of every two axes in some row; strength 3 holds every triple. Rows are built
greedily, one at a time, each the best of a few random candidates (the AETG method): seed the row
with a tuple nobody covers yet, then give every other axis the value that covers the most
uncovered tuples with the values already chosen.

Some combinations cannot run at all (a torchrun restart needs the launcher; one process has no
other rank count to resume on). They are `Forbidden` pairs: no row holds them and nobody has to
cover them.

Example:
    >>> axes = {"a": [0, 1], "b": ["x", "y"], "c": [True, False]}
    >>> rows = covering_array(axes, strength=2)
    >>> len(rows), missing(rows, axes, strength=2)
    (4, [])
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]
Interaction = tuple[tuple[str, Any], ...]  # ((axis, value), ...) in axis order


@dataclasses.dataclass(frozen=True)
class Forbidden:
    """A pair of axis values that cannot meet in one row, and why.

    Example:
        >>> Forbidden("layout", "single", "interruption", "restart", "torchrun restarts need the launcher")
    """

    axis_a: str
    value_a: Any
    axis_b: str
    value_b: Any
    reason: str

    def hit_by(self, row: Mapping[str, Any]) -> bool:
        """True when `row` (possibly partial) holds both values."""
        return (
            self.axis_a in row
            and self.axis_b in row
            and row[self.axis_a] == self.value_a
            and row[self.axis_b] == self.value_b
        )


def allowed(row: Mapping[str, Any], forbidden: Iterable[Forbidden]) -> bool:
    """True when no forbidden pair occurs in `row` (a partial row is fine)."""
    return not any(rule.hit_by(row) for rule in forbidden)


def _check_axes(axes: Mapping[str, Sequence[Any]], strength: int, forbidden) -> None:
    if not isinstance(strength, int) or not 1 <= strength <= len(axes):
        raise ValueError(
            f"strength must be an int in [1, {len(axes)}] (the axes), got {strength!r}"
        )
    for name, values in axes.items():
        if not values:
            raise ValueError(f"axis {name!r} has no values")
        if len(set(values)) != len(values):
            raise ValueError(f"axis {name!r} repeats a value: {list(values)}")
    for rule in forbidden:
        for axis, value in ((rule.axis_a, rule.value_a), (rule.axis_b, rule.value_b)):
            if axis not in axes or value not in axes[axis]:
                raise ValueError(f"{rule}: {axis}={value!r} is not an axis value")


def interactions(
    axes: Mapping[str, Sequence[Any]], strength: int, forbidden: Iterable[Forbidden] = ()
) -> set[Interaction]:
    """Every t-tuple of values of t different axes that no forbidden pair rules out."""
    forbidden = list(forbidden)
    found = set()
    for names in itertools.combinations(list(axes), strength):
        for values in itertools.product(*(axes[n] for n in names)):
            tup = tuple(zip(names, values))
            if allowed(dict(tup), forbidden):
                found.add(tup)
    return found


def covered_by(row: Mapping[str, Any], strength: int, order: Sequence[str]) -> set[Interaction]:
    """The t-tuples that one full row covers (its axes taken `strength` at a time)."""
    names = [n for n in order if n in row]
    return {tuple((n, row[n]) for n in combo) for combo in itertools.combinations(names, strength)}


def covering_array(
    axes: Mapping[str, Sequence[Any]],
    strength: int = 2,
    *,
    forbidden: Iterable[Forbidden] = (),
    seed: int = 0,
    candidates: int = 24,
) -> list[Row]:
    """A greedy covering array of `strength` over `axes`, avoiding the `forbidden` pairs.

    Args:
        axes: `{axis: [values...]}`, in the order rows list them.
        strength: t; every allowed t-tuple of values appears in some row.
        forbidden: pairs no row may hold.
        seed: the random tie-breaking (the same seed gives the same rows).
        candidates: rows tried per chosen row (more: fewer rows, slower).
    Returns:
        the rows, as `{axis: value}` dicts.
    Raises:
        ValueError: bad axes, or an allowed tuple that no allowed row can hold (add the
            forbidden pair that makes it impossible).
    """
    forbidden = list(forbidden)
    _check_axes(axes, strength, forbidden)
    order = list(axes)
    rng = random.Random(seed)
    uncovered = interactions(axes, strength, forbidden)
    rows: list[Row] = []
    while uncovered:
        pool = sorted(uncovered, key=repr)
        best, best_gain = None, 0
        for _ in range(candidates):
            row = _candidate(rng.choice(pool), axes, order, strength, forbidden, uncovered, rng)
            if row is None:
                continue
            gain = len(covered_by(row, strength, order) & uncovered)
            if gain > best_gain:
                best, best_gain = row, gain
        if best is None:
            stuck = pool[0]
            raise ValueError(
                f"no allowed row holds {dict(stuck)}: forbid the pair that makes it impossible"
            )
        rows.append(best)
        uncovered -= covered_by(best, strength, order)
    return rows


def _candidate(seed_tuple, axes, order, strength, forbidden, uncovered, rng) -> Row | None:
    """One greedy row grown from `seed_tuple`, or None when some axis has no allowed value."""
    row: Row = dict(seed_tuple)
    if not allowed(row, forbidden):
        return None
    rest = [n for n in order if n not in row]
    rng.shuffle(rest)
    for name in rest:
        chosen = [n for n in order if n in row]
        best_values, best_gain = [], -1
        for value in axes[name]:
            trial = {**row, name: value}
            if not allowed(trial, forbidden):
                continue
            gain = 0
            for others in itertools.combinations(chosen, strength - 1):
                names = sorted((*others, name), key=order.index)
                if tuple((n, trial[n]) for n in names) in uncovered:
                    gain += 1
            if gain > best_gain:
                best_values, best_gain = [value], gain
            elif gain == best_gain:
                best_values.append(value)
        if not best_values:
            return None
        row[name] = rng.choice(best_values)
    return {n: row[n] for n in order}


def missing(
    rows: Iterable[Mapping[str, Any]],
    axes: Mapping[str, Sequence[Any]],
    strength: int,
    forbidden: Iterable[Forbidden] = (),
) -> list[dict[str, Any]]:
    """The allowed t-tuples that no row covers (empty for a covering array), by brute force.

    Written without the generator's bookkeeping so that it can check it.
    """
    rows = list(rows)
    forbidden = list(forbidden)
    absent = []
    for names in itertools.combinations(list(axes), strength):
        for values in itertools.product(*(axes[n] for n in names)):
            want = dict(zip(names, values))
            if not allowed(want, forbidden):
                continue
            if not any(all(r.get(n) == v for n, v in want.items()) for r in rows):
                absent.append(want)
    return absent


def full_product(
    axes: Mapping[str, Sequence[Any]], forbidden: Iterable[Forbidden] = ()
) -> list[Row]:
    """Every allowed row (the cross product minus the forbidden pairs)."""
    forbidden = list(forbidden)
    names = list(axes)
    rows = [dict(zip(names, values)) for values in itertools.product(*axes.values())]
    return [r for r in rows if allowed(r, forbidden)]
