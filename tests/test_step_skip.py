"""Skipped steps (skip_nonfinite, the fp16 overflow guard) through `fit`, which donates: a skipped
step leaves params, buffers and optimizer state bit-identical, and the run afterwards equals a
hand-written loop that never applied that batch's update."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import functrain
from functrain import optim
from functrain.tree import tree_clone, tree_leaves

BAD = 2  # the batch whose gradient is not finite
LR, WD = 1e-2, 1e-2


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


def batches(n=6, bad=BAD, poison=float("inf")):
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        if i == bad:
            x[0, 0] = poison  # the forward pass, the loss and every gradient go non-finite
        out.append((x, y))
    return out


def ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


class Snapshots:
    """Clones of the state's tensors around batch BAD (fit donates: they change in place)."""

    def __init__(self):
        self.before = self.after = self.metrics = None

    def batch_start(self, ctx):
        if ctx.state.timestamp.batch == BAD:
            self.before = tree_clone((ctx.state.params, ctx.state.buffers, ctx.state.opt_state))

    def batch_end(self, ctx):
        if ctx.state.timestamp.batch == BAD + 1:
            self.after = tree_clone((ctx.state.params, ctx.state.buffers, ctx.state.opt_state))
            self.metrics, self.step = ctx.metrics, ctx.state.step


def bit_identical(a, b):
    la, lb = tree_leaves(a), tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y  # counters (Adam's count, the lr's count) did not advance
    return True


def torch_reference(data, skip):
    """Hand-written loop: forward, backward, fused AdamW; on `skip`, no update at all (and the
    BatchNorm statistics the forward pass changed are put back)."""
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    for i, (x, y) in enumerate(data):
        if i == skip:
            continue  # the step reads nothing of a skipped batch
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def test_skip_nonfinite_inside_fit_leaves_the_state_untouched_and_the_run_as_if_unseen():
    data = batches()
    model = net()
    opt = optim.adamw(lr=LR, weight_decay=WD)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce, opt, skip_nonfinite=True)
    snaps = Snapshots()
    final = functrain.fit(
        step, state, data, duration=f"{len(data)}ba", eval_interval=None, callbacks=[snaps]
    )
    assert bool(snaps.metrics["skipped"]) is True  # a 0-d bool tensor, decided on the device
    assert bit_identical(snaps.before, snaps.after)
    assert snaps.step == BAD + 1  # the batch was consumed: the step counter moved on
    assert final.step == len(data) and final.timestamp.batch == len(data)
    for t in tree_leaves((final.params, final.buffers, final.opt_state)):
        assert not isinstance(t, torch.Tensor) or bool(torch.isfinite(t).all())

    reference = torch_reference(data, skip=BAD)
    for name, p in reference.named_parameters():
        assert torch.allclose(final.params[name], p.detach(), rtol=1e-6, atol=1e-7), name
    for name, b in reference.named_buffers():
        assert torch.allclose(final.buffers[name], b, rtol=1e-6, atol=1e-7), name
    # Adam's step count is that of the batches actually applied.
    assert final.opt_state[0].count == len(data) - 1


def test_a_skipped_pure_step_returns_the_input_state_unchanged():
    model = net()
    opt = optim.adamw(lr=LR)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce, opt, skip_nonfinite=True)
    good, bad = batches(2, bad=1)
    state, metrics = step(state, good)
    assert bool(metrics["skipped"]) is False
    before = tree_clone(state)
    new, metrics = step(state, bad)
    assert bool(metrics["skipped"]) is True
    assert bit_identical(
        (new.params, new.buffers, new.opt_state), (before.params, before.buffers, before.opt_state)
    )
    assert bit_identical(
        (state.params, state.buffers, state.opt_state),
        (before.params, before.buffers, before.opt_state),
    )
    assert new.step == state.step + 1


def fp16_loss(model, batch):
    x, y, boost = batch
    return F.cross_entropy(model(x), y) * boost


def test_fp16_overflow_inside_fit_skips_exactly_and_halves_the_scale():
    gen = torch.Generator().manual_seed(3)
    data = [
        (
            torch.randn(8, 6, generator=gen),
            torch.randint(0, 3, (8,), generator=gen),
            torch.tensor(1e30 if i == BAD else 1.0),  # overflows float16 in the backward pass
        )
        for i in range(5)
    ]

    def run(data):
        model = net()
        opt = optim.adamw(lr=LR, weight_decay=WD)
        state = functrain.init(model, opt, seed=0)
        step = functrain.make_step(model, fp16_loss, opt, precision="amp_fp16")
        snaps = Snapshots()
        final = functrain.fit(
            step, state, data, duration=f"{len(data)}ba", eval_interval=None, callbacks=[snaps]
        )
        return final, snaps

    final, snaps = run(data)
    assert bool(snaps.metrics["skipped"]) is True  # a 0-d bool tensor, decided on the device
    assert bit_identical(snaps.before, snaps.after)
    assert float(final.algo_state["loss_scale"].scale) == 2.0**15
    # A run that never saw the overflowing batch applies the same updates (the loss scale is a
    # power of two, so its halving changes no unscaled gradient).
    unseen, _ = run(data[:BAD] + data[BAD + 1 :])
    for name in final.params:
        assert torch.equal(final.params[name], unseen.params[name]), name
    assert bit_identical(final.opt_state, unseen.opt_state)


@pytest.mark.parametrize("donate", [False, True])
def test_a_custom_guard_decides_and_update_is_not_called_on_a_skip(donate):
    calls = []

    def every_other(pieces):
        inner_guard, inner_update = pieces.guard, pieces.update

        def guard(result, grad_norm, state):
            state, skip = inner_guard(result, grad_norm, state)
            return state, skip or state.step % 2 == 1

        def update(grads, state):
            calls.append(state.step)
            return inner_update(grads, state)

        return pieces._replace(guard=guard, update=update)

    model = net()
    opt = optim.sgd(lr=0.1)
    state = functrain.init(copy.deepcopy(model), opt, seed=0)
    step = functrain.compose(
        functrain.make_step(model, ce, opt, donate=donate),
        functrain.Algorithm("every_other", every_other),
    )
    skipped = []
    for batch in batches(4, bad=-1):
        state, metrics = step(state, batch)
        skipped.append(metrics["skipped"])
    assert calls == [0, 2] and skipped == [False, True, False, True]
    assert state.step == 4


HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.slow
def test_every_rank_skips_the_steps_one_rank_found_bad(tmp_path):
    sys.path.insert(0, HERE)
    try:
        import step_skip_worker
    finally:
        sys.path.remove(HERE)
    one = step_skip_worker.train()  # one process, the whole batches
    out = tmp_path / "two.json"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), env.get("PYTHONPATH")) if p
    )
    worker = os.path.join(HERE, "step_skip_worker.py")
    done = subprocess.run(
        [sys.executable, "-m", "functrain.launch", "-n", "2", worker, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert one["skipped"] == [False, True, False, True, False]
    for plan, two in json.loads(out.read_text()).items():
        assert two["skipped"] == one["skipped"], plan
        assert two["step"] == 5
        for name, value in one["params"].items():
            got, expected = torch.tensor(two["params"][name]), torch.tensor(value)
            assert torch.allclose(got, expected, atol=1e-5, rtol=0), (plan, name)
