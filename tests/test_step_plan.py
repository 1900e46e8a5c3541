"""The step's plan cache (functrain/step_plan.py): decided once per state structure, checked
whenever a state arrives that the step did not produce, read in O(1) while it is fed its own.

These are the cache's own promises (a mistake in them is silent: the numbers stay right while a
bad state goes unchecked or every call pays for the search); the step's numbers are
tests/test_step.py's.
"""

import pytest
import torch
from torch import nn

from functrain import optim
from functrain.step.plan import Plans, _plain


def _params(rows=3):
    return {"w": torch.ones(rows, 2), "b": torch.zeros(rows)}


def _counting(params):
    calls = []

    def get():
        calls.append(1)
        return params

    return get, calls


def test_plain_means_tensors_of_one_dtype_and_device():
    assert _plain({"a": torch.ones(2), "b": torch.zeros(3, 1)})
    assert not _plain({})  # nothing to take a norm of in two kernels
    assert not _plain({"a": torch.ones(2), "b": torch.ones(2, dtype=torch.float64)})
    assert not _plain({"a": nn.Parameter(torch.ones(2))})  # only exact torch.Tensor


def test_a_state_the_step_did_not_produce_is_checked_every_time():
    opt = optim.adamw(1e-3)
    params = _params()
    good, wrong = opt.init(params), opt.init(_params(rows=4))  # moments of another shape
    with pytest.raises(ValueError):
        Plans().plan_for(wrong, lambda: params)  # on first sight
    plans = Plans()
    plan = plans.plan_for(good, lambda: params)
    updates, new = opt.update(params, good, params)
    plans.produced(new, plan)
    get, calls = _counting(params)
    assert plans.plan_for(new, get) is plan and not calls  # its own output: no check
    with pytest.raises(ValueError):  # same structure, not its output: checked again
        plans.plan_for(wrong, lambda: params)


def _warmup(count):
    return 0.1 * count


@pytest.mark.parametrize(
    "opt",
    [
        optim.sgd(_warmup),  # the lr leaf two keys deep
        optim.scale_by_learning_rate(_warmup),  # one key deep
        optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(_warmup)),  # three keys deep
    ],
    ids=["sgd", "bare", "chained"],
)
def test_the_learning_rate_is_read_from_its_own_leaf(opt):
    # a warm-up from 0: the first lr (0.0) equals the count leaf before it (0); the reader must
    # still follow the lr leaf, and read it directly rather than by searching the whole state
    params = _params()
    state = opt.init(params)
    plan = Plans().plan_for(state, lambda: params)
    assert plan.read_lr is not optim.current_lr
    for expected in (0.0, 0.0, 0.1, 0.2):  # the lr last used: before any update, then per update
        assert plan.read_lr(state) == pytest.approx(expected)
        assert optim.current_lr(state) == pytest.approx(expected)
        _, state = opt.update(params, state, params)
