"""The evaluation sanity check (issue 31.2): at a fresh start fit evaluates the first
`sanity_check_batches` (2) batches of each eval set before training, so a broken evaluation
fails at once; it changes nothing of the run (state, logged metrics, events, torch's global
generator) and a resumed run skips it."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import functrain
from functrain.checkpoint import Manager
from functrain.loop.events import Event
from functrain.loop.sanity_check import SanityCheckError


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def data(n: int, seed: int, shuffle: bool = False):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    dataset = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=shuffle)


class Record:
    """Every event, and every logged metric."""

    def __init__(self):
        self.events, self.logged = [], []

    def __getattribute__(self, name):
        if name in {e.value for e in Event}:
            return lambda ctx: object.__getattribute__(self, "events").append(name)
        return object.__getattribute__(self, name)

    def log_metrics(self, metrics, step):
        self.logged.append((step, {k: float(v) for k, v in metrics.items()}))


class CountingEvalFn:
    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    def __call__(self, model, batch):
        self.calls += 1
        if self.fail:
            raise KeyError("no such output")
        return model(batch[0]), batch[1]


class Trained:
    def __init__(self):
        self.batches = 0

    def batch_end(self, ctx):
        self.batches += 1


def run(eval_fn=None, root=None, callbacks=(), **kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = functrain.optim.adam(lr=1e-2)
    step = functrain.make_step(model, ce, opt)
    record, trained = Record(), Trained()
    state = functrain.fit(
        step, functrain.init(model, opt, seed=1), data(64, 0, shuffle=True), duration="2ep",
        eval_data=data(40, 1, shuffle=True), eval_metrics="accuracy", eval_fn=eval_fn,
        loggers=[record], callbacks=[trained, *callbacks], progress=False, log_interval="2ba",
        checkpoints=None if root is None else Manager(root), autoresume=root is not None,
        **kwargs,
    )  # fmt: skip
    return state, record, trained


def test_a_broken_evaluation_fails_before_the_first_batch_naming_the_check_and_the_way_off():
    with pytest.raises(SanityCheckError, match=r"sanity_check_batches=0") as caught:
        run(eval_fn=CountingEvalFn(fail=True), callbacks=[trained := Trained()])
    assert "KeyError" in str(caught.value) and "the first 2 batches of eval_data" in str(
        caught.value
    )
    assert trained.batches == 0
    assert isinstance(caught.value.__cause__, KeyError)


def test_without_the_check_the_broken_evaluation_fails_only_after_an_epoch():
    trained = Trained()
    with pytest.raises(KeyError):
        run(eval_fn=CountingEvalFn(fail=True), callbacks=[trained], sanity_check_batches=0)
    assert trained.batches == 8


def test_the_check_evaluates_two_batches_and_changes_nothing_of_the_run():
    torch.manual_seed(123)
    checked_fn = CountingEvalFn()
    checked, checked_record, _ = run(eval_fn=checked_fn)
    after_checked = torch.get_rng_state()
    torch.manual_seed(123)
    plain_fn = CountingEvalFn()
    plain, plain_record, _ = run(eval_fn=plain_fn, sanity_check_batches=0)
    after_plain = torch.get_rng_state()
    assert checked_fn.calls == plain_fn.calls + 2  # two batches, not the set's five
    for key, value in functrain.tree.leaves_with_paths(plain):
        if isinstance(value, torch.Tensor):
            other = dict(functrain.tree.leaves_with_paths(checked))[key]
            assert torch.equal(value, other), key
    assert checked_record.events == plain_record.events  # no event of its own
    assert checked_record.logged == plain_record.logged  # nothing logged, no eval counted
    assert torch.equal(after_checked, after_plain)  # torch's global generator untouched


@pytest.mark.filterwarnings("ignore:resuming DataLoader")
def test_more_batches_on_request_and_none_on_resume(tmp_path):
    fn = CountingEvalFn()
    stopper = StopAt(5)
    run(eval_fn=fn, root=tmp_path, callbacks=[stopper], sanity_check_batches=3)
    assert fn.calls == 3  # stopped before the first evaluation: only the check ran
    resumed = CountingEvalFn()
    run(eval_fn=resumed, root=tmp_path, sanity_check_batches=3)
    assert resumed.calls == 2 * 5  # the two real evaluations of five batches, no check


class StopAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            ctx.request_stop("test")


def test_sanity_check_batches_is_checked():
    with pytest.raises(ValueError, match="sanity_check_batches=-1"):
        functrain.loop.options.FitOptions.create(duration="1ep", sanity_check_batches=-1)
