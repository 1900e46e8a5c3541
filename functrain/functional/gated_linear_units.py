"""Gated linear units (Shazeer, 2020): replace a transformer MLP with a GLU MLP.

`proj(act(fc(x)))` becomes `proj(act(gate(x)) * value(x))`. The value layer starts from the
original `fc` weights and `proj` is copied; the gate layer is freshly initialised. Targets are
modules exposing `fc` and `proj` (`nn.Linear`), an `act` module and optionally a `dropout` module,
as `functrain.models.gpt.MLP` does; Hugging Face BERT and GPT-2 blocks are handled by
`functrain.functional.gated_linear_units_hf`.

Example:
    >>> from functrain.models import GPT, GPTConfig
    >>> model = apply_gated_linear_units(GPT(GPTConfig()))
    >>> type(model.blocks[0].mlp).__name__
    'GLUMLP'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .module_surgery import check_module, reject_optimizers, replace_modules


class GLUMLP(nn.Module):
    """`dropout(proj(act(gate(x)) * value(x)))`.

    Args:
        in_features: width of the input.
        hidden_features: width of the gated hidden layer.
        out_features: width of the output.
        act: the gate's activation module.
        gated_layer_bias: whether `gate` has a bias.
        non_gated_layer_bias: whether `value` has a bias.
        proj_bias: whether `proj` has a bias.
        dropout: dropout module applied to the output (None: identity).
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: int,
        act: nn.Module,
        gated_layer_bias: bool = False,
        non_gated_layer_bias: bool = False,
        proj_bias: bool = True,
        dropout: nn.Module | None = None,
    ):
        super().__init__()
        self.gate = nn.Linear(in_features, hidden_features, bias=gated_layer_bias)
        self.value = nn.Linear(in_features, hidden_features, bias=non_gated_layer_bias)
        self.act = act
        self.proj = nn.Linear(hidden_features, out_features, bias=proj_bias)
        self.dropout = dropout if dropout is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.gate(x)) * self.value(x)))


def _is_mlp(module: nn.Module) -> bool:
    return (
        isinstance(getattr(module, "fc", None), nn.Linear)
        and isinstance(getattr(module, "proj", None), nn.Linear)
        and isinstance(getattr(module, "act", None), nn.Module)
    )


def glu_from_mlp(
    mlp: nn.Module,
    act_fn: Callable[[torch.Tensor], torch.Tensor] | nn.Module | None = None,
    gated_layer_bias: bool = False,
    non_gated_layer_bias: bool = False,
) -> GLUMLP:
    """The GLU version of one MLP module (see the module docstring for what is copied)."""
    fc, proj = mlp.fc, mlp.proj
    if act_fn is None:
        act = mlp.act
    elif isinstance(act_fn, nn.Module):
        act = act_fn
    else:
        act = _Lambda(act_fn)
    glu = GLUMLP(
        fc.in_features,
        fc.out_features,
        proj.out_features,
        act,
        gated_layer_bias=gated_layer_bias,
        non_gated_layer_bias=non_gated_layer_bias,
        proj_bias=proj.bias is not None,
        dropout=getattr(mlp, "dropout", None),
    ).to(device=fc.weight.device, dtype=fc.weight.dtype)
    with torch.no_grad():
        glu.value.weight.copy_(fc.weight)
        if non_gated_layer_bias and fc.bias is not None:
            glu.value.bias.copy_(fc.bias)
        glu.proj.weight.copy_(proj.weight)
        if proj.bias is not None:
            glu.proj.bias.copy_(proj.bias)
    return glu


class _Lambda(nn.Module):
    """A plain function as a module (for `act_fn` callables)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def apply_gated_linear_units(
    model: nn.Module,
    optimizers: Any = None,
    act_fn: Callable[[torch.Tensor], torch.Tensor] | nn.Module | None = None,
    gated_layer_bias: bool = False,
    non_gated_layer_bias: bool = False,
) -> nn.Module:
    """A copy of `model` with every MLP replaced by a gated one (Composer's signature).

    Replaced: functrain MLPs (`fc`/`act`/`proj` modules) by `GLUMLP`; Hugging Face BERT and GPT-2
    feed-forward blocks as `functrain.functional.gated_linear_units_hf` says.

    Args:
        model: the model (not modified).
        optimizers: Composer's second argument; functrain's surgery rewires no optimizer, so only
            None is accepted (an optimizer here raises a TypeError that says what to do).
        act_fn: the gate activation (None: the MLP's own activation).
        gated_layer_bias: give the gate layer a bias.
        non_gated_layer_bias: give the value layer a bias (copied from the first layer's).
    Returns:
        the new model.
    Raises:
        ValueError: when the model has no such MLP module.
    """
    check_module(model, "apply_gated_linear_units")
    if optimizers is not None and not _is_optimizer(optimizers) and act_fn is None:
        raise TypeError(
            "apply_gated_linear_units(model, optimizers, act_fn, ...) follows Composer's "
            f"signature: the second argument is the optimizers, got {type(optimizers).__name__}; "
            "pass the activation by name: apply_gated_linear_units(model, act_fn=...)"
        )
    reject_optimizers("apply_gated_linear_units", optimizers)
    count = 0

    def policy(name: str, module: nn.Module):
        nonlocal count
        if _is_mlp(module):
            count += 1
            return glu_from_mlp(module, act_fn, gated_layer_bias, non_gated_layer_bias)
        return None

    new = replace_modules(model, policy)
    from .gated_linear_units_hf import apply_hf_gated_linear_units  # it imports GLUMLP from here

    count += apply_hf_gated_linear_units(new, act_fn, gated_layer_bias, non_gated_layer_bias)
    if count == 0:
        raise ValueError(
            "apply_gated_linear_units found no MLP module (one with nn.Linear `fc` and `proj` and "
            "an `act` module, like functrain.models.gpt.MLP, or a Hugging Face BERT / GPT-2 "
            "feed-forward block)"
        )
    return new


def _is_optimizer(value: Any) -> bool:
    items = value if isinstance(value, (list, tuple)) else [value]
    return all(isinstance(item, torch.optim.Optimizer) for item in items)
