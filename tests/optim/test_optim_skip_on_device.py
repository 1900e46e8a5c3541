"""A guard decides on the device (issue 27): `skip_nonfinite` and the fp16 loss scale hand the
step a 0-d bool tensor, the update runs and is kept or discarded elementwise. The run must be
bit-identical to one whose guard decides on the host and never calls the update on a skip (the
behaviour before), for every fused composition, the transforms' own path and a custom update
piece, donating or not."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_optim_fused import DOCUMENTED, batches, loss_fn, make_model

import functrain
from functrain import optim
from functrain.optim.keeping import counts_on_device, keep_where, snapshot
from functrain.tree import tree_flatten

BAD = (0, 3)  # a first step skipped (SGD's first-step momentum) and a later one

OPTIMIZERS = {
    **{name: factory for name, (factory, _) in DOCUMENTED.items()},
    "chain(clip_by_value, adam) (not fused)": lambda: optim.chain(
        optim.clip_by_value(0.5), optim.adam(1e-2)
    ),
}


def poisoned(n: int = 6) -> list:
    data = batches(n, seed=1)
    for i in BAD:
        data[i][0][0, 0] = float("inf")  # every gradient and the loss go non-finite
    return data


def on_the_host(pieces):
    """The guard as it was: its decision read on the host, the update not called on a skip."""
    inner = pieces.guard

    def guard(result, grad_norm, state):
        state, skip = inner(result, grad_norm, state)
        return state, bool(skip)

    return pieces._replace(guard=guard)


def counting_update(calls):
    def apply(pieces):
        inner = pieces.update

        def update(grads, state):
            calls.append(state.step)
            return inner(grads, state)

        return pieces._replace(update=update)

    return functrain.Algorithm("counting_update", apply)


def run(name: str, donate: bool, host: bool, custom_update: bool = False, **options):
    model, opt = make_model(), OPTIMIZERS[name]()
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, loss_fn, opt, donate=donate, **options)
    algorithms = []
    if custom_update:
        algorithms.append(counting_update([]))
    if host:
        algorithms.append(functrain.Algorithm("on_the_host", on_the_host))
    if algorithms:
        step = functrain.compose(step, *algorithms)
    skipped = []
    for batch in poisoned():
        state, metrics = step(state, batch)
        skipped.append(metrics["skipped"])
    return state, skipped


def assert_bit_identical(a, b, floats: bool = False) -> None:
    """Tensors bit for bit, counts by value (a Python int or a 0-d tensor); Python floats when
    `floats` (they are the lr or decay factor last used: on a skip the device path holds the
    skipped step's value, which the next update evaluates again from the time)."""
    la, lb = tree_flatten(a)[0], tree_flatten(b)[0]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            assert x.dtype == y.dtype
            assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert int(x) == int(y)  # an update count
        elif isinstance(x, int) or floats:
            assert x == y


@pytest.mark.parametrize("donate", [False, True])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_device_decided_skip_gives_the_host_decided_run_bit_for_bit(name, donate):
    device, skipped = run(name, donate, host=False, skip_nonfinite=True)
    host, host_skipped = run(name, donate, host=True, skip_nonfinite=True)
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.bool for s in skipped)
    assert [bool(s) for s in skipped] == host_skipped == [i in BAD for i in range(6)]
    assert_bit_identical(
        (device.params, device.buffers, device.opt_state),
        (host.params, host.buffers, host.opt_state),
    )
    assert device.step == host.step == 6


@pytest.mark.parametrize("donate", [False, True])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_guarded_run_that_skips_nothing_is_the_unguarded_run_bit_for_bit(name, donate):
    """The update a device decision keeps is the unguarded one: the counts a guarded step keeps
    as tensors give Adam the same bias corrections as Python ints do."""
    results = []
    for guarded in (True, False):
        model, opt = make_model(), OPTIMIZERS[name]()
        state = functrain.init(model, opt, seed=0)
        step = functrain.make_step(model, loss_fn, opt, donate=donate, skip_nonfinite=guarded)
        for batch in batches(4, seed=2):
            state, _ = step(state, batch)
        results.append((state.params, state.opt_state))
    assert_bit_identical(*results, floats=True)


@pytest.mark.parametrize("donate", [False, True])
def test_a_custom_update_piece_is_undone_on_the_device_and_fp16_scales_alike(donate):
    # a custom update piece runs on every step and is put back from a copy on a skip
    device, _ = run("adamw", donate, host=False, custom_update=True, precision="amp_fp16")
    host, _ = run("adamw", donate, host=True, custom_update=True, precision="amp_fp16")
    assert_bit_identical(
        (device.params, device.opt_state, device.algo_state),
        (host.params, host.opt_state, host.algo_state),
    )
    assert float(device.algo_state["loss_scale"].scale) == 2.0**16 / 4  # halved twice


def test_an_unguarded_step_keeps_its_counts_python_ints():
    model, opt = make_model(), optim.adamw(1e-2)
    state = functrain.init(model, opt, seed=0)
    state, metrics = functrain.make_step(model, loss_fn, opt)(state, batches(1)[0])
    assert "skipped" not in metrics
    assert state.opt_state[0].count == 1 and type(state.opt_state[0].count) is int


FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(FLOATS, FLOATS), min_size=1, max_size=8),
    st.booleans(),
    st.booleans(),
    st.integers(0, 5),
)
def test_keep_where_selects_exactly_one_side(pairs, skip, inplace, count):
    """A law: every leaf is bit for bit the old one on a skip and the new one otherwise, NaNs
    and infinities included; a count is a 0-d int64 tensor holding the selected value."""
    old = torch.tensor([p[0] for p in pairs])
    new = torch.tensor([p[1] for p in pairs])
    before = {"t": old.clone(), "count": count, "lr": 0.5}
    after = {"t": new.clone(), "count": count + 1, "lr": 0.25}
    flag = torch.tensor(skip)
    kept = keep_where(flag, before, after, inplace=inplace)
    want = old if skip else new
    assert torch.equal(kept["t"].view(torch.int32), want.view(torch.int32))
    assert kept["count"].dtype == torch.int64 and int(kept["count"]) == count + (not skip)
    assert kept["lr"] == 0.25
    if inplace:
        assert kept["t"] is after["t"]
    # overwritten in place: the snapshot taken before is what a skip restores
    saved = snapshot(before)
    before["t"].copy_(new)
    again = keep_where(flag, before, before, saved)
    assert torch.equal(again["t"].view(torch.int32), want.view(torch.int32))


def test_counts_on_device_turns_only_update_counts_into_tensors():
    tree = (0, 0.1, True, {"m": torch.zeros(2)})
    moved = counts_on_device(tree, "cpu")
    assert isinstance(moved[0], torch.Tensor) and moved[0].dtype == torch.int64
    assert moved[1:3] == (0.1, True) and moved[3]["m"] is tree[3]["m"]
    assert counts_on_device(moved, "cpu") is moved
