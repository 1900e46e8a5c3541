"""The pure step: its input state is never modified, under every optimizer, while it recycles the
buffers of states nobody holds any more; and it computes what the donating step computes."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F

import functrain
from functrain import optim, schedules
from functrain.optim.buffers import BufferPool
from functrain.tree import tensor_leaves, tree_allclose, tree_clone

OPTIMIZERS = {
    "adamw": lambda: optim.adamw(1e-2, weight_decay=0.1),
    "adam_amsgrad": lambda: optim.adam(1e-2, amsgrad=True, weight_decay=0.01),
    "chain_clip_masked_cosine": lambda: optim.chain(
        optim.clip_by_global_norm(0.1),
        optim.adamw(
            1e-2 * schedules.cosine_annealing_with_warmup("2ba", t_max="20ba"),
            weight_decay_mask=optim.no_decay_mask,
        ),
    ),
    "decoupled_adamw": lambda: optim.decoupled_adamw(1e-2, weight_decay=1e-2),
    "sgd": lambda: optim.sgd(0.1, weight_decay=1e-3),
    "sgd_nesterov": lambda: optim.sgd(0.1, momentum=0.9, nesterov=True),
    "decoupled_sgdw": lambda: optim.decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-2),
    "lion": lambda: optim.lion(1e-3, weight_decay=0.1),
    "injected": lambda: optim.inject_hyperparams(optim.adamw)(
        lr=0.01 * schedules.linear(t_max="20ba")
    ),
    "masked": lambda: optim.masked(optim.adam(1e-2), optim.no_decay_mask),
    # no fused form: the transforms' own in-place path on private copies
    "clip_by_value": lambda: optim.chain(optim.clip_by_value(0.01), optim.sgd(0.1, momentum=0.9)),
    "adaptive_clip": lambda: optim.chain(optim.adaptive_grad_clip(0.01), optim.adamw(1e-2)),
    "multi_steps": lambda: optim.multi_steps(optim.adamw(1e-2), every_k=2),
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def batches(n):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def pointers(state):
    return {t.data_ptr() for t in tensor_leaves((state.params, state.opt_state))}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_pure_step_never_modifies_a_state_someone_holds_and_matches_the_donating_step(name):
    model, twin = make_model(), make_model()
    opt = OPTIMIZERS[name]()
    pure = functrain.make_step(model, loss_fn, opt)
    donating = functrain.make_step(twin, loss_fn, opt, donate=True)
    state = functrain.init(model, opt, seed=0)
    model_before = {k: v.detach().clone() for k, v in model.named_parameters()}
    twin_state = functrain.init(twin, opt, seed=0)
    kept = []  # (state, its snapshot): states the caller holds on to
    seen, recycled = set(), 0
    for i, batch in enumerate(batches(8)):
        if i in (2, 5):
            kept.append((state, tree_clone(state)))
        new, _ = pure(state, batch)
        # The previous input's buffers come back once nobody holds them: the test exercises
        # the recycling, not only fresh allocations.
        recycled += bool(pointers(new) & seen)
        seen |= pointers(state)
        state = new
        twin_state, _ = donating(twin_state, batch)
    assert recycled >= 3
    for held, snapshot in kept:
        assert tree_allclose(held.params, snapshot.params, atol=0, rtol=0)
        assert tree_allclose(held.opt_state, snapshot.opt_state, atol=0, rtol=0)
        assert tree_allclose(held.buffers, snapshot.buffers, atol=0, rtol=0)
    for k, v in model.named_parameters():  # init shares the model's tensors: never written
        assert torch.equal(v.detach(), model_before[k])
    assert tree_allclose(state.params, twin_state.params, atol=1e-6)
    assert tree_allclose(state.opt_state, twin_state.opt_state, atol=1e-6)


@pytest.mark.parametrize(
    "hold",
    [
        pytest.param(lambda t: t[1:], id="a view"),
        pytest.param(lambda t: t.detach(), id="a detached alias"),
        pytest.param(lambda t: t.numpy(), id="a numpy array"),
        pytest.param(weakref.ref, id="a weak reference"),
        pytest.param(lambda t: t.untyped_storage(), id="its storage"),
        pytest.param(lambda t: [t], id="a list"),
    ],
)
def test_buffer_pool_never_reuses_a_tensor_anything_still_refers_to(hold):
    pool = BufferPool()
    current = pool.private_copies([torch.randn(5), torch.randn(2, 3)])
    for _ in range(3):  # reach the steady state: two buffer sets alternate
        current = pool.private_copies(current)
    previous, current = current, pool.private_copies(current)
    reference = hold(previous[0])
    values, address = previous[0].clone(), previous[0].data_ptr()
    del previous
    current = pool.private_copies(current)
    assert current[0].data_ptr() != address
    current = pool.private_copies(current)
    alive = reference() if isinstance(reference, weakref.ref) else reference
    if isinstance(alive, torch.Tensor) and alive.shape == values.shape:
        assert torch.equal(alive, values)


def test_buffer_pool_reuses_dropped_buffers_and_copies_exactly():
    pool = BufferPool()
    src = [torch.randn(4, 3).t(), torch.randn(7, requires_grad=True)]  # a transposed stride too
    first = pool.private_copies(src)
    assert [c.stride() for c in first] == [s.stride() for s in src]
    assert all(torch.equal(c, s) and c.data_ptr() != s.data_ptr() for c, s in zip(first, src))
    assert [c.requires_grad for c in first] == [False, True]
    del src
    second = pool.private_copies(first)
    addresses = {t.data_ptr() for t in second}
    third = pool.private_copies(second)
    del second
    fourth = pool.private_copies(third)  # `second` was dropped: its buffers come back
    assert {t.data_ptr() for t in fourth} == addresses
    assert all(torch.equal(a, b) for a, b in zip(fourth, third))


def test_buffer_pool_never_writes_into_a_dropped_tensor_that_was_resized():
    """A tensor fed back (the loop `state = step(state, batch)`) is known to fit its slot's
    retired buffer, except after an in-place `resize_` by its holder: the copies still have the
    inputs' shapes and values."""
    pool = BufferPool()
    first = pool.private_copies([torch.arange(6.0), torch.ones(2, 2)])
    second = pool.private_copies(first)
    first[0].resize_(2)  # the caller changes a tensor it is about to drop
    del first
    third = pool.private_copies(second)
    assert [t.shape for t in third] == [torch.Size([6]), torch.Size([2, 2])]
    assert torch.equal(third[0], torch.arange(6.0)) and torch.equal(third[1], torch.ones(2, 2))


def test_buffer_pool_reuses_a_dropped_state_that_was_not_fed_back():
    """A state not returned by the pool (e.g. one loaded from a checkpoint) lends its buffers
    too, once dropped, to the next call's copies of the same layout."""
    pool = BufferPool()
    # a transposed layout that is no view (a view's base would keep its storage referenced)
    loaded = [torch.empty_strided((3, 4), (1, 3)).normal_(), torch.randn(5)]
    addresses = [t.data_ptr() for t in loaded]
    pool.private_copies(loaded)
    del loaded
    fresh = [torch.empty_strided((3, 4), (1, 3)).normal_(), torch.randn(5)]
    copies = pool.private_copies(fresh)
    assert [t.data_ptr() for t in copies] == addresses
    assert all(torch.equal(c, f) and c.stride() == f.stride() for c, f in zip(copies, fresh))


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda t: t.double(), id="another dtype"),
        pytest.param(lambda t: t.t().contiguous().t(), id="another stride"),
        pytest.param(lambda t: t.to("meta"), id="another device"),
    ],
)
def test_buffer_pool_never_lends_a_buffer_of_another_layout(other):
    """A dropped buffer of the same shape but another dtype, stride or device is not written
    into: the copy has the input's layout (and, off the meta device, its values)."""
    pool = BufferPool()
    pool.private_copies([torch.randn(3, 2)])  # retired, unreferenced: a candidate
    tensor = other(torch.randn(3, 2))
    (copy,) = pool.private_copies([tensor])
    assert (copy.dtype, copy.device, copy.stride()) == (
        tensor.dtype,
        tensor.device,
        tensor.stride(),
    )
    if tensor.device.type != "meta":
        assert torch.equal(copy, tensor)
