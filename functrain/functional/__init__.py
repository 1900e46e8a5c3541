"""Pure functional cores of functrain's speedup methods (Composer's `composer.functional` names).

Every function here is deterministic given its explicit inputs: random choices are either passed in
(`mixing=`, `indices=`, `bbox=`, ...) or drawn from an explicit `generator=` (never from torch's
global generator). The step-level transforms in `functrain.algorithms` call these with keys from
`functrain.rng.key_for(state.rng, state.step, name, rank)`.

Example:
    >>> import functrain.functional as ff
    >>> g = torch.Generator().manual_seed(0)
    >>> x_mixed, y_perm, mixing = ff.mixup_batch(torch.randn(4, 3), torch.arange(4), generator=g)
"""

# -- data and loss methods ----------------------------------------------------------------------
from . import augmentation_primitives
from .augmentation_primitives import augmentation_sets
from .augmix import augmix_batch, augmix_image
from .batch import get_item, set_item, take
from .colout import colout_batch
from .cutmix import cutmix_batch, rand_bbox
from .cutout import cutout_batch
from .label_smoothing import smooth_labels
from .mixup import mixup_batch, sample_mixing
from .progressive_resizing import progressive_scale, resize_batch
from .randaugment import randaugment_batch, randaugment_image
from .selective_backprop import (
    select_indices_using_loss,
    select_using_loss,
    should_selective_backprop,
)
from .seq_length_warmup import set_batch_sequence_length, warmup_sequence_length
from .targets import check_for_index_targets, ensure_targets_one_hot

__all__ = [
    "augmentation_primitives",
    "augmentation_sets",
    "augmix_batch",
    "augmix_image",
    "check_for_index_targets",
    "colout_batch",
    "cutmix_batch",
    "cutout_batch",
    "ensure_targets_one_hot",
    "get_item",
    "mixup_batch",
    "progressive_scale",
    "rand_bbox",
    "randaugment_batch",
    "randaugment_image",
    "resize_batch",
    "sample_mixing",
    "select_indices_using_loss",
    "select_using_loss",
    "set_batch_sequence_length",
    "set_item",
    "should_selective_backprop",
    "smooth_labels",
    "take",
    "warmup_sequence_length",
]

# -- surgery ------------------------------------------------------------------------------------
# Model-surgery cores (Module -> Module on a copy) and the weight/gradient cores (EMA, SWA, SAM,
# clipping, freezing) are listed in the `__all__` of `functional/surgery.py` and
# `functional/weights.py`; everything listed there is re-exported here.
from . import surgery as _surgery  # noqa: E402
from . import weights as _weights  # noqa: E402


def _reexport(module) -> None:
    for name in module.__all__:
        globals()[name] = getattr(module, name)
        __all__.append(name)


_reexport(_surgery)
_reexport(_weights)
