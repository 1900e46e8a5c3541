"""Which fused kernel call updates each parameter, with which tensors, in which memory layout.

The executor (`functrain.optim.fused`) calls a kernel once per group of parameters alike: the
same decay setting, device and dtype. A kernel walks each tensor's memory as one flat array, so a
parameter, its gradient and its moments must be dense and laid out alike: `group_layout` refuses
parameters or moments that are not (the transforms' own update runs them), and
`grads_laid_out_like_params` copies a gradient laid out otherwise (a transposed gradient, as
`torch.bmm(x, w.transpose(1, 2))` gives) into its parameter's layout on every call.

Example:
    >>> layout = group_layout(recipe, names, params, [grads, mu, nu])
    >>> groups = {key: columns_of(group, [params, grads, mu, nu], local)
    ...           for key, group, local, _ in layout}
    >>> grads_laid_out_like_params(groups, layout)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import _torch
from ._foreach import is_dtensor, placed_alike
from .recipe import NotFusable, Recipe

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def selected(mask: Any, names: list[str], source: Mapping[str, Any]) -> set[str]:
    values = mask(source) if callable(mask) else mask
    missing = [k for k in names if k not in values]
    if missing:
        raise NotFusable(f"the mask has no entry for {missing[:5]}")  # update() says it clearly
    return {k for k in names if bool(values[k])}


def _local(x: torch.Tensor) -> torch.Tensor:
    return _torch.local_tensor(x) if is_dtensor(x) else x


def _pieces(tensors: list[Any]) -> list[torch.Tensor] | None:
    """The local tensors a kernel can run on (a parameter, its gradient, its moments), or None
    when they do not line up."""
    for t in tensors:
        if type(t) not in _PLAIN:
            param = tensors[0]
            if not all(is_dtensor(x) and placed_alike(param, x) for x in tensors):
                return None
            tensors = [_local(x) for x in tensors]
            break
    param = tensors[0]
    dtype, device, strides = param.dtype, param.device, param.stride()
    # The kernels walk each tensor's memory as one flat array, so a parameter and its moments
    # must be dense and laid out alike (the gradient, tensors[1], is checked on every call).
    if dtype not in _FLOATS or not (param.is_contiguous() or dense(param)):  # C decides most
        return None
    for index, t in enumerate(tensors):
        if t.dtype != dtype or t.device != device:
            return None
        if index > 1 and t.stride() != strides and not same_layout(t, param):
            return None
    return tensors


def dense(t: torch.Tensor) -> bool:
    """True when `t`'s elements fill its memory exactly once, in some order of its dimensions
    (contiguous, channels-last, a transposed contiguous tensor; not a slice with a step)."""
    if t.is_contiguous():  # the common case, decided in C
        return True
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when `a` and `b` (of one shape) have the same strides, except on dimensions of size
    1, where a stride says nothing."""
    ours, theirs = a.stride(), b.stride()
    if ours == theirs:  # the common case: one tuple comparison per tensor, every step
        return True
    return all(x == y or n == 1 for x, y, n in zip(ours, theirs, a.shape))


def grads_laid_out_like_params(groups: dict, layout: list) -> None:
    """Give each group's gradient column its parameter's memory layout, copying where they
    differ.

    Why: the kernels index a gradient's memory as if it were laid out like its parameter. A
    gradient that is not (`torch.bmm(x, w.transpose(1, 2))` gives a 3-D weight a transposed
    one) would silently get wrong updates, so it is copied; the gradients are the executor's to
    overwrite. A gradient of another dtype or device has no fused form.

    Args:
        groups: `{group key: columns}` (`columns_of`), the gradients in `columns[1]`.
        layout: the `group_layout` the groups were built from: each group's device, dtype and
            parameter strides, so only the gradients are read here (this runs on every call).
    Raises:
        NotFusable: a gradient's dtype or device differs from its parameter's.
    """
    for key, _, _, strides in layout:
        _, device, dtype = key
        columns = groups[key]
        grads = columns[1]
        for i, (grad, stride) in enumerate(zip(grads, strides)):
            if grad.dtype is not dtype or grad.device != device:
                raise NotFusable("a gradient of another dtype or device than its parameter")
            if grad.stride() != stride and not same_layout(grad, columns[0][i]):
                grads[i] = torch.empty_like(columns[0][i]).copy_(grad)


def group_layout(recipe: Recipe, names: list[str], params: Mapping, trees: list) -> list:
    """`[(group key, names, DTensor pieces, parameter strides)]`: which kernel call updates each
    parameter; the key is `(decayed, device, dtype)`.

    Raises:
        NotFusable: a parameter's tensors (it, its gradient, its moments) do not line up.
    """
    decay_on = recipe.decay is not None
    decayed = None
    if recipe.decay is not None and recipe.decay.mask is not None:
        decayed = selected(recipe.decay.mask, names, params)
    groups: dict[tuple, tuple[list[str], bool, list]] = {}
    for name in names:
        tensors = [params[name], *[tree[name] for tree in trees]]
        pieces = _pieces(tensors)
        if pieces is None:
            raise NotFusable(f"{name!r}: tensors of mixed kinds, dtypes or devices")
        first = pieces[0]
        key = (decay_on and (decayed is None or name in decayed), first.device, first.dtype)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([], pieces[0] is not tensors[0], [])
        group[0].append(name)
        group[2].append(first.stride())
    return [(key, group, local, strides) for key, (group, local, strides) in groups.items()]


def columns_of(names: list[str], trees: list, local: bool) -> list[list[torch.Tensor]]:
    """The kernel's tensor lists for one group: a column per tree (params, grads, moments)."""
    if local:
        return [[_local(tree[name]) for name in names] for tree in trees]
    return [[tree[name] for name in names] for tree in trees]
