"""Leaf-by-leaf comparison of two pytrees, described for a person: which leaf, how it differs.

The law checkers compare states, batches and optimizer outputs with `tree_difference`; it returns
None when the trees are equal (bit for bit by default: same structure, same scalars, tensors of
the same shape and dtype whose elements are equal, NaN equal to NaN) and otherwise a sentence
naming the first leaf that differs, how many of its elements differ, the largest absolute
difference and where it is.

Example:
    >>> tree_difference({"w": torch.zeros(2)}, {"w": torch.tensor([0.0, 0.5])})
    'leaf w: 1 of 2 elements differ, max abs difference 0.5 at index (1,) (expected 0.0, got 0.5)'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..tree import leaves_with_paths, tree_clone


def snapshot(tree: Any) -> Any:
    """A copy of `tree` whose tensors share nothing with it (to compare against later)."""
    return tree_clone(tree)


def _tensor_difference(path: str, a: torch.Tensor, b: torch.Tensor, rtol, atol) -> str | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return (
            f"leaf {path}: expected shape {tuple(a.shape)} {a.dtype}, "
            f"got shape {tuple(b.shape)} {b.dtype}"
        )
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_complex():  # compare real and imaginary parts as a trailing dimension of 2
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    # Widened so that every dtype compares exactly: floats as float64, integers and bools as int64.
    wide_a, wide_b = (a.double(), b.double()) if a.is_floating_point() else (a.long(), b.long())
    if a.is_floating_point():
        close = (wide_a - wide_b).abs() <= atol + rtol * wide_b.abs()
        differs = ~(close | (wide_a == wide_b) | (wide_a.isnan() & wide_b.isnan()))
    else:
        differs = wide_a != wide_b
    count = int(differs.sum())
    if count == 0:
        return None
    gap = torch.where(
        differs, (wide_a.double() - wide_b.double()).abs().nan_to_num(float("inf")), 0
    )
    flat = int(gap.reshape(-1).argmax())
    index = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else ()
    )
    return (
        f"leaf {path}: {count} of {a.numel()} elements differ, max abs difference "
        f"{float(gap.reshape(-1)[flat]):.6g} at index {index} "
        f"(expected {a.reshape(-1)[flat].item()!r}, got {b.reshape(-1)[flat].item()!r})"
    )


def tree_difference(
    expected: Any,
    got: Any,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    ignore: Iterable[str] = (),
) -> str | None:
    """None when `expected` and `got` are equal leaf by leaf, else a description of the first gap.

    Args:
        expected, got: pytrees (states, batches, `{name: tensor}` dicts, ...).
        rtol, atol: tolerances for floating-point tensors (0: bit for bit, NaN equals NaN).
        ignore: dotted leaf paths (or prefixes of them, "timestamp.elapsed_sec") not compared.
    Returns:
        None, or one line naming the leaf and how it differs.
    Example:
        >>> assert tree_difference(state_before, state) is None, "the step changed its input"
    """
    skip = tuple(ignore)

    def kept(tree: Any) -> dict[str, Any]:
        return {
            p: v
            for p, v in leaves_with_paths(tree)
            if not any(p == s or p.startswith(s + ".") for s in skip)
        }

    a, b = kept(expected), kept(got)
    if list(a) != list(b):
        missing, extra = [p for p in a if p not in b], [p for p in b if p not in a]
        if missing or extra:
            return f"the trees differ in structure: leaves only expected {missing[:5]}, only got {extra[:5]}"
        return f"the trees list their leaves in another order: {list(a)[:5]} vs {list(b)[:5]}"
    for path, x in a.items():
        y = b[path]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            gap = _tensor_difference(path, x, y, rtol, atol)
            if gap is not None:
                return gap
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return f"leaf {path}: expected {type(x).__name__} {x!r}, got {type(y).__name__} {y!r}"
        elif type(x) is not type(y) or x != y:
            if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
                continue  # NaN equals NaN here, as for tensors
            return f"leaf {path}: expected {x!r}, got {y!r}"
    return None


__all__ = ["snapshot", "tree_difference"]
