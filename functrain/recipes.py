"""Recipes: Composer's tested bundles of speedup algorithms, as plain lists of `Algorithm`s.

The CNN recipes are Composer's ResNet-50/ImageNet recipes (`resnet50_mild.yaml`,
`resnet50_medium.yaml`, `resnet50_spicy.yaml`; "hot" is the spicy one), with the same algorithms
and hyperparameters. Composer pairs them with training budgets: mild for short runs, medium for
about 1.5x, hot for 3x or more of the baseline's 90 epochs. The transformer recipe bundles
low-precision LayerNorm, ALiBi, gated linear units and sequence-length warm-up.

Use a recipe in two places: surgery before `init`, the rest in the step.

    algorithms = functrain.recipes.medium()
    model = functrain.algorithms.apply_surgery(model, algorithms)
    state = functrain.init(model, optimizer)
    step = functrain.compose(functrain.make_step(model, loss_fn, optimizer), *algorithms)

Lists are ordinary Python lists: drop, replace or append algorithms as you like.
"""

from __future__ import annotations

from typing import Any

from . import algorithms as alg
from .step import Algorithm


def _data(name: str, **kwargs: Any) -> Algorithm:
    """A data-side algorithm by name, with a clear error while its module is missing."""
    factory = getattr(alg, name, None)
    if factory is None:
        raise ImportError(
            f"this recipe needs functrain.algorithms.{name}, which is not available in this "
            "installation"
        )
    return factory(**kwargs)


def _cnn_base(label_smoothing: float, resizing: dict, input_key: Any, target_key: Any) -> list:
    return [
        alg.blurpool(replace_convs=True, replace_maxpools=True, blur_first=True, min_channels=16),
        alg.channels_last(),
        alg.ema(half_life="100ba", update_interval="20ba"),
        _data("label_smoothing", smoothing=label_smoothing, target_key=target_key),
        _data(
            "progressive_resizing",
            mode="resize",
            size_increment=4,
            resize_targets=False,
            input_key=input_key,
            target_key=target_key,
            **resizing,
        ),
    ]


def mild(*, input_key: Any = 0, target_key: Any = 1) -> list[Algorithm]:
    """Composer's mild CNN recipe: BlurPool, channels-last, EMA, label smoothing 0.08 and
    progressive resizing (initial scale 0.5, delay 0.4, fine-tune 0.2).

    Args:
        input_key: where the images are in a batch (Composer's convention).
        target_key: where the labels are.
    Returns:
        the algorithms, in Composer's order.
    """
    resizing = {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2}
    return _cnn_base(0.08, resizing, input_key, target_key)


def medium(*, input_key: Any = 0, target_key: Any = 1) -> list[Algorithm]:
    """Composer's medium CNN recipe: mild's algorithms (label smoothing 0.1) plus MixUp
    (alpha 0.2) and SAM (rho 0.5, every 10 steps).

    Args:
        input_key: where the images are in a batch.
        target_key: where the labels are.
    Returns:
        the algorithms, in Composer's order.
    """
    resizing = {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2}
    algorithms = _cnn_base(0.1, resizing, input_key, target_key)
    algorithms.insert(
        4,
        _data(
            "mixup", alpha=0.2, interpolate_loss=False, input_key=input_key, target_key=target_key
        ),
    )
    algorithms.append(alg.sam(rho=0.5, epsilon=1e-12, interval=10))
    return algorithms


def hot(
    *,
    target_layer_name: Any = ("ResidualBlock", "BasicBlock", "Bottleneck"),
    input_key: Any = 0,
    target_key: Any = 1,
) -> list[Algorithm]:
    """Composer's hot ("spicy") CNN recipe: BlurPool, channels-last, ColOut (0.05/0.05), EMA,
    label smoothing 0.13, MixUp (alpha 0.25), progressive resizing (initial scale 0.6, delay 0.2,
    fine-tune 0.2), RandAugment (depth 1, severity 10), SAM (rho 0.5, every 5 steps) and
    sample-wise stochastic depth (drop rate 0.1, linear).

    Args:
        target_layer_name: the residual block class (name) for stochastic depth.
        input_key: where the images are in a batch.
        target_key: where the labels are.
    Returns:
        the algorithms, in Composer's order.
    """
    keys = {"input_key": input_key, "target_key": target_key}
    resizing = {"initial_scale": 0.6, "delay_fraction": 0.2, "finetune_fraction": 0.2}
    base = _cnn_base(0.13, resizing, input_key, target_key)
    blurpool, channels_last, ema, label_smoothing, progressive_resizing = base
    return [
        blurpool,
        channels_last,
        # The list order is the order batch transforms run: RandAugment works on clean images
        # (Composer applies it in the dataset), before ColOut and MixUp change them.
        _data("randaugment", severity=10, depth=1, augmentation_set="all", input_key=input_key),
        _data("colout", p_row=0.05, p_col=0.05, batch=True, resize_target="auto", **keys),
        ema,
        label_smoothing,
        _data("mixup", alpha=0.25, interpolate_loss=False, **keys),
        progressive_resizing,
        alg.sam(rho=0.5, epsilon=1e-12, interval=5),
        alg.stochastic_depth(
            target_layer_name,
            stochastic_method="sample",
            drop_rate=0.1,
            drop_distribution="linear",
            drop_warmup="0.0dur",
        ),
    ]


def transformer(
    max_sequence_length: int = 1024,
    *,
    train_sequence_length_scaling: float = 1.0,
    warmup_duration: float = 0.3,
    min_seq_length: int = 8,
    step_size: int = 8,
) -> list[Algorithm]:
    """A transformer recipe: low-precision LayerNorm, ALiBi, GLU MLPs, sequence-length warm-up.

    Args:
        max_sequence_length: the longest sequence (ALiBi's maximum and the warm-up's target).
        train_sequence_length_scaling: ALiBi's training-length fraction (1: leave the length to
            the warm-up, which already trains on short sequences early).
        warmup_duration: fraction of training spent warming the sequence length up.
        min_seq_length: the warm-up's first length.
        step_size: the warm-up's length increment.
    Returns:
        the algorithms; the first three are surgery for `apply_surgery`.
    """
    return [
        alg.low_precision_layernorm(),
        alg.alibi(max_sequence_length, train_sequence_length_scaling=train_sequence_length_scaling),
        alg.gated_linear_units(),
        _data(
            "seq_length_warmup",
            duration=warmup_duration,
            min_seq_length=min_seq_length,
            max_seq_length=max_sequence_length,
            step_size=step_size,
            truncate=True,
        ),
    ]


__all__ = ["hot", "medium", "mild", "transformer"]
