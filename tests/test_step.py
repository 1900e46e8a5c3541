"""The step: equality with a hand-written loop, purity, donation, microbatching, precision."""

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import functrain
from functrain import optim
from functrain.tree import tree_allclose, tree_clone


class SmallNet(torch.nn.Module):
    """A small CNN with BatchNorm and dropout: buffers and global randomness both matter."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.conv = torch.nn.Conv2d(
            1, 4, 3, padding=1, bias=False
        )  # a bias before BN has ~0 gradient: Adam would amplify rounding noise
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(dropout)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(x.flatten(1)))


def ce_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_data(n_batches=5, batch_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch_size, 1, 8, 8, generator=gen),
            torch.randint(0, 10, (batch_size,), generator=gen),
        )
        for _ in range(n_batches)
    ]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_matches_hand_written_adamw_loop_after_100_steps(dtype, tol):
    # float64 isolates the semantics (measured agreement ~1e-15); in float32 the two differ only
    # by rounding order (optax-style updates are added, torch fuses addcdiv), which drifts by
    # ~1 ulp per step: ~2e-6 after 100 steps on this model.
    torch.manual_seed(0)
    model = SmallNet().to(dtype)
    reference = copy.deepcopy(model)
    torch_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=1e-2)
    data = [(x.to(dtype), y) for x, y in make_data()]
    for i in range(100):
        x, y = data[i % len(data)]
        torch_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        torch_opt.step()

    opt = optim.adamw(lr=1e-3, weight_decay=1e-2)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce_loss, opt)
    for i in range(100):
        state, _ = step(state, data[i % len(data)])
    for name, p in reference.named_parameters():
        assert torch.allclose(state.params[name], p.detach(), atol=tol, rtol=0), name
    for name, b in reference.named_buffers():
        assert torch.allclose(state.buffers[name].double(), b.double(), atol=tol), name


def test_pure_step_leaves_input_state_unchanged():
    model = SmallNet()
    opt = optim.adamw(lr=1e-2)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce_loss, opt)
    state, _ = step(state, make_data(1)[0])  # non-trivial optimizer state
    before = tree_clone(state)
    new_state, _ = step(state, make_data(1, seed=1)[0])
    assert tree_allclose(state, before)
    assert not tree_allclose(new_state.params, before.params)


def test_donating_step_equals_pure_step_and_reuses_memory():
    model = SmallNet()
    opt = optim.adamw(lr=1e-2)
    data = make_data(3)
    pure = functrain.make_step(model, ce_loss, opt)
    donating = pure.with_options(donate=True)
    state_a = tree_clone(functrain.init(model, opt, seed=0))
    state_b = tree_clone(state_a)
    for batch in data:
        state_a, _ = pure(state_a, batch)
    pointers = {k: v.data_ptr() for k, v in state_b.params.items()}
    for batch in data:
        state_b, _ = donating(state_b, batch)
    assert tree_allclose(state_a, state_b, atol=1e-7)
    assert pointers == {k: v.data_ptr() for k, v in state_b.params.items()}


@settings(max_examples=8, deadline=None)
@given(microbatch=st.integers(1, 16))
def test_microbatching_matches_full_batch(microbatch):
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen))
    full, _ = functrain.make_step(model, ce_loss, opt)(state, batch)
    split, metrics = functrain.make_step(model, ce_loss, opt, microbatch_size=microbatch)(
        state, batch
    )
    assert tree_allclose(full.params, split.params, atol=1e-6)
    assert metrics["samples"] == 16


@pytest.mark.parametrize("microbatch", [5, 3, 7, 10])  # 16: 5+5+5+1, 3*5+1, 7+7+2, 10+6
def test_reported_loss_under_uneven_microbatches_is_the_full_batch_mean(microbatch):
    """The step's `loss` metric is the mean over all samples, whatever the split: a small last
    microbatch weighs by its size (an unweighted mean of microbatch losses would differ)."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = optim.sgd(lr=0.1)
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    with torch.no_grad():  # by hand, before the update: the mean over the 16 samples
        expected = float(F.cross_entropy(model(x), y))
        unweighted = sum(
            float(F.cross_entropy(model(x[i : i + microbatch]), y[i : i + microbatch]))
            for i in range(0, 16, microbatch)
        ) / len(range(0, 16, microbatch))
    assert abs(unweighted - expected) > 1e-4  # the data tell the two apart
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce_loss, opt, microbatch_size=microbatch)
    _, metrics = step(state, (x, y))
    assert abs(float(metrics["loss"]) - expected) < 1e-6


def test_weight_by_tokens_weights_microbatches_by_token_count():
    model = torch.nn.Linear(3, 1, bias=False)
    opt = optim.sgd(lr=1.0)
    state = functrain.init(model, opt, seed=0)
    x = torch.randn(4, 3)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the second microbatch has one token, the first two

    def token_loss(model, batch):
        x, m = batch
        return ((model(x).squeeze(-1) ** 2) * m).sum() / m.sum()

    step = functrain.make_step(
        model,
        token_loss,
        opt,
        microbatch_size=2,
        weight_by="tokens",
        count_tokens=lambda b: int(b[1].sum()),
    )
    new, metrics = step(state, (x, mask))
    full, _ = functrain.make_step(model, token_loss, opt, count_tokens=lambda b: int(b[1].sum()))(
        state, (x, mask)
    )
    assert torch.allclose(new.params["weight"], full.params["weight"], atol=1e-6)
    assert metrics["tokens"] == 3 and new.timestamp.token == 3


def test_same_seed_is_bit_identical_with_dropout_and_differs_with_other_seed():
    def run(seed):
        torch.manual_seed(123)
        model = SmallNet(dropout=0.5)
        opt = optim.sgd(lr=0.1, momentum=0.9)
        state = functrain.init(model, opt, seed=seed)
        step = functrain.make_step(model, ce_loss, opt)
        for batch in make_data(4):
            torch.rand(3)  # global RNG use elsewhere must not matter
            state, _ = step(state, batch)
        return state

    a, b, c = run(0), run(0), run(1)
    assert tree_allclose(a.params, b.params)
    assert not tree_allclose(a.params, c.params)


def test_metrics_and_counters():
    model = SmallNet()
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce_loss, opt)
    batch = make_data(1)[0]
    with torch.no_grad():  # by hand, on a copy (the state shares the model's tensors)
        expected = F.cross_entropy(copy.deepcopy(model)(batch[0]), batch[1])
    state, metrics = step(state, batch)
    assert state.step == 1 and state.timestamp.batch == 1 and state.timestamp.sample == 16
    assert metrics["loss"].shape == ()
    torch.testing.assert_close(metrics["loss"], expected, rtol=1e-6, atol=1e-6)
    assert metrics["grad_norm"] > 0
    assert metrics["lr"] == pytest.approx(0.1)
    assert metrics["samples"] == 16


@pytest.mark.parametrize("precision", ["amp_bf16", "amp_fp16"])
def test_mixed_precision_trains(precision):
    torch.manual_seed(0)
    model = SmallNet()
    opt = optim.adamw(lr=1e-2)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, ce_loss, opt, precision=precision)
    batch = make_data(1)[0]
    losses = []
    for _ in range(15):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0]
    if precision == "amp_fp16":
        assert state.algo_state["loss_scale"].scale > 0


def test_fp16_loss_scale_backs_off_and_skips_on_overflow():
    model = torch.nn.Linear(2, 1)
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(model, lambda m, b: m(b).sum() * 1e30, opt, precision="amp_fp16")
    new, metrics = step(state, torch.ones(4, 2))
    assert bool(metrics["skipped"])
    assert torch.equal(new.params["weight"], state.params["weight"])
    assert float(new.algo_state["loss_scale"].scale) == 2.0**15


def test_skip_nonfinite_keeps_params():
    model = torch.nn.Linear(2, 1)
    opt = optim.adamw(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    step = functrain.make_step(
        model, lambda m, b: m(b).sum() * float("nan"), opt, skip_nonfinite=True
    )
    new, metrics = step(state, torch.ones(4, 2))
    assert bool(metrics["skipped"])
    assert tree_allclose(new.params, state.params)
    assert new.step == 1


def test_frozen_parameters_are_not_updated():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    model[0].weight.requires_grad_(False)
    opt = optim.adamw(lr=0.1, weight_decay=0.5)
    state = functrain.init(model, opt, seed=0)
    new, _ = functrain.make_step(model, lambda m, b: m(b).pow(2).mean(), opt)(
        state, torch.randn(4, 3)
    )
    assert torch.equal(new.params["0.weight"], state.params["0.weight"])
    assert not torch.equal(new.params["1.weight"], state.params["1.weight"])


def test_tied_weights_get_one_parameter_and_the_summed_gradient():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx):
            return self.head(self.emb(idx))

    torch.manual_seed(0)
    model = Tied()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    batch = (torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 4]))
    ref_opt.zero_grad()
    F.cross_entropy(reference(batch[0]), batch[1]).backward()
    ref_opt.step()
    opt = optim.sgd(lr=0.5)
    state = functrain.init(model, opt, seed=0)
    assert list(state.params) == ["emb.weight"]
    state, _ = functrain.make_step(model, ce_loss, opt)(state, batch)
    assert torch.allclose(state.params["emb.weight"], reference.emb.weight, atol=1e-6)


def test_compose_applies_algorithms_in_order_and_initialises_their_state():
    calls = []

    def tagging(tag):
        def apply(pieces):
            inner = pieces.prepare

            def prepare(state, batch):
                batch = inner(state, batch)  # the convention: transform what earlier ones made
                calls.append(tag)
                return batch

            return pieces._replace(prepare=prepare)

        return functrain.Algorithm(name=tag, apply=apply, init=lambda state: {"count": 0})

    model = torch.nn.Linear(2, 1)
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    step = functrain.compose(
        functrain.make_step(model, lambda m, b: m(b).mean(), opt), tagging("a"), tagging("b")
    )
    state, _ = step(state, torch.ones(2, 2))
    assert calls == ["a", "b"]
    assert set(state.algo_state) == {"a", "b"}


def test_bad_inputs_give_clear_errors():
    model = torch.nn.Linear(2, 1)
    opt = optim.sgd(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    with pytest.raises(ValueError, match="precision"):
        functrain.make_step(model, ce_loss, opt, precision="fp8")
    with pytest.raises(ValueError, match="count_tokens"):
        functrain.make_step(model, ce_loss, opt, weight_by="tokens")
    step = functrain.make_step(model, lambda m, b: m(b), opt)
    with pytest.raises(TypeError, match="scalar loss"):
        step(state, torch.ones(3, 2))
    with pytest.raises(ValueError, match="no tensor"):
        functrain.make_step(model, lambda m, b: m(b).sum(), opt)(state, {"x": "text"})
    with pytest.raises(TypeError, match="TrainState"):
        step({"params": {}}, torch.ones(3, 2))
    with pytest.raises(TypeError, match="nn.Module"):
        functrain.init(lambda x: x, opt)


def test_donating_run_from_init_updates_the_model_in_place_like_a_plain_loop():
    torch.manual_seed(0)
    model = SmallNet()
    twin = copy.deepcopy(model)
    opt = optim.adamw(lr=1e-2)
    data = make_data(3)
    pure_state = functrain.init(twin, opt, seed=0)
    pure = functrain.make_step(twin, ce_loss, opt)
    for batch in data:
        pure_state, _ = pure(pure_state, batch)
    state = functrain.init(model, opt, seed=0)
    donating = functrain.make_step(model, ce_loss, opt, donate=True)
    assert donating._grads_piece.in_place(state)  # the fast path: no parameter swapping
    for batch in data:
        state, _ = donating(state, batch)
    assert tree_allclose(state.params, pure_state.params, atol=1e-6)
    assert tree_allclose(state.buffers, pure_state.buffers, atol=1e-6)
    for name, p in model.named_parameters():  # the model follows training, as in a plain loop
        assert torch.equal(p.detach(), state.params[name])


def test_func_grad_mode_matches_autograd_mode():
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = optim.adamw(lr=0.1)
    state = functrain.init(model, opt, seed=0)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen))
    by_autograd, m1 = functrain.make_step(model, ce_loss, opt, microbatch_size=8)(state, batch)
    by_func, m2 = functrain.make_step(model, ce_loss, opt, microbatch_size=8, grad_mode="func")(
        state, batch
    )
    assert tree_allclose(by_autograd.params, by_func.params, atol=1e-6)
    assert torch.allclose(m1["loss"], m2["loss"])


def test_fused_adamw_path_of_a_donating_step_equals_the_pure_step():
    torch.manual_seed(0)
    model = SmallNet()
    twin = copy.deepcopy(model)
    opt = optim.adamw(lr=1e-2, weight_decay=0.1)
    assert optim.fused_plan(opt, dict(model.named_parameters())) is not None
    data = make_data(4)
    pure_state = functrain.init(twin, opt, seed=0)
    pure = functrain.make_step(twin, ce_loss, opt)
    state = functrain.init(model, opt, seed=0)
    donating = functrain.make_step(model, ce_loss, opt, donate=True)
    for batch in data:
        pure_state, pure_metrics = pure(pure_state, batch)
        assert optim.executor.may_fuse(opt, state.params, state.params)
        state, metrics = donating(state, batch)
    assert tree_allclose(state.params, pure_state.params, atol=1e-6)
    assert tree_allclose(state.opt_state, pure_state.opt_state, atol=1e-6)  # same structure too
    assert metrics["lr"] == pure_metrics["lr"] == pytest.approx(1e-2)


def test_normalize_loss_forms():
    # (killers of `python -m bench mutants` survivors in functrain/pieces.py)
    from functrain.step.pieces import normalize_loss

    loss = torch.tensor(2.0)
    assert normalize_loss(loss)[0] is loss  # a 0-d loss is returned as it is, no reshape
    one = torch.tensor([3.0])
    assert normalize_loss(one)[0].shape == () and normalize_loss(one)[0].item() == 3.0
    got, aux = normalize_loss((loss, {"acc": 0.5}))
    assert got is loss and aux == {"acc": 0.5}
    assert normalize_loss((loss, 7))[1] == {"aux": 7}
    param = torch.nn.Parameter(torch.tensor(1.5))  # a Tensor subclass is a loss too
    assert normalize_loss(param)[0] is param and normalize_loss(param)[1] == {}
    with pytest.raises(TypeError, match="scalar loss"):
        normalize_loss(torch.ones(2))


def test_step_config_and_algorithm_defaults():
    from functrain.step.pieces import Algorithm, StepConfig

    config = StepConfig()
    assert (config.precision, config.skip_nonfinite, config.donate) == ("fp32", False, False)
    assert (config.grad_mode, config.report_grad_norms) == ("autograd", False)
    assert config.weight_by == "samples" and config.microbatch_size is None
    assert Algorithm("a", lambda pieces: pieces).resumable is True


def test_the_global_gradient_norm_of_no_gradients_is_zero_and_matches_torch():
    # a model whose parameters are all frozen has an empty gradient tree (mutants: step.py:335)
    from functrain.step.make import _grad_norm

    assert float(_grad_norm({}, plain=True)) == 0.0
    grads = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([[12.0]])}
    assert float(_grad_norm(grads, plain=True)) == 13.0  # sqrt(9 + 16 + 144)
    assert float(_grad_norm(grads, plain=False)) == 13.0


def test_a_loss_that_raises_leaves_the_model_holding_its_own_tensors():
    """The pure step swaps the state's tensors into the model's parameter and buffer slots for
    the forward pass; when the loss raises, every slot gets its own tensor back (and the next
    call runs normally)."""
    model = SmallNet()
    own = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}
    opt = optim.sgd(0.1)
    calls = []

    def flaky_loss(model, batch):
        calls.append(1)
        if len(calls) == 1:
            model(batch[0])  # the swapped-in tensors are in use when it raises
            raise RuntimeError("bad batch")
        return ce_loss(model, batch)

    step = functrain.make_step(model, flaky_loss, opt)
    state = tree_clone(functrain.init(model, opt, seed=0))  # not the model's own tensors
    with pytest.raises(RuntimeError, match="bad batch"):
        step(state, make_data(1)[0])
    now = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}
    assert all(now[k] is own[k] for k in own)
    assert isinstance(model.fc.weight, torch.nn.Parameter)
    new_state, _ = step(state, make_data(1)[0])
    assert not tree_allclose(new_state.params, state.params)
    assert model.fc.weight is own["fc.weight"] and model.bn.running_mean is own["bn.running_mean"]


def test_compose_refuses_what_is_not_an_algorithm():
    model = torch.nn.Linear(2, 1)
    step = functrain.make_step(model, lambda m, b: m(b).mean(), optim.sgd(lr=0.1))
    with pytest.raises(TypeError, match="Algorithm objects, got function"):
        functrain.compose(step, lambda pieces: pieces)


def test_donated_is_the_same_step_allowed_to_donate():
    model = torch.nn.Linear(2, 1)
    step = functrain.make_step(model, lambda m, b: m(b).mean(), optim.sgd(lr=0.1))
    assert not step.config.donate
    donating = step.donated()
    assert donating is not step and donating.config.donate
    assert donating.donated() is donating  # already donating: nothing to change


def _oom_over(limit):
    """A mean-squared loss that raises CUDA's out-of-memory error on more than `limit` samples
    (how a too-large microbatch fails on a GPU), and records each microbatch's size."""
    sizes = []

    def loss(model, batch):
        x, y = batch
        sizes.append(len(x))
        assert len(sizes) < 50, "out-of-memory retried without end"
        if len(x) > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return F.mse_loss(model(x), y)

    return loss, sizes


def test_auto_microbatch_halves_on_cuda_out_of_memory_until_it_fits():
    # The halving runs only on CUDA: the step is told it is on one (its device type), and the
    # loss fails like a GPU would above 2 samples. Expected: plain SGD on the whole batch.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    w, b = model.weight.detach().clone(), model.bias.detach().clone()
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 3, generator=gen), torch.randn(8, 2, generator=gen)
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    gw, gb = torch.autograd.grad(F.mse_loss(x @ wr.T + br, y), [wr, br])
    loss, sizes = _oom_over(2)
    opt = optim.sgd(lr=0.5)
    step = functrain.make_step(model, loss, opt, microbatch_size="auto")
    step._device_type = "cuda"
    state, _ = step(functrain.init(model, opt, seed=0), (x, y))
    assert sizes == [8, 4, 2, 2, 2, 2]  # 8 and 4 fail; then four microbatches of 2
    torch.testing.assert_close(state.params["weight"], w - 0.5 * gw)
    torch.testing.assert_close(state.params["bias"], b - 0.5 * gb)
    # nothing fits, not even one sample: the error is raised, not retried forever
    loss, sizes = _oom_over(0)
    step = functrain.make_step(model, loss, opt, microbatch_size="auto")
    step._device_type = "cuda"
    with pytest.raises(torch.cuda.OutOfMemoryError):
        step(functrain.init(model, opt, seed=0), (x, y))
    assert sizes == [8, 4, 2, 1]


def test_a_donating_step_from_init_compares_storage_once_then_only_identity(monkeypatch):
    from functrain.step.grads import GradsPiece

    calls = []
    compare = GradsPiece.state_is_model
    monkeypatch.setattr(
        GradsPiece, "state_is_model", lambda self, state: calls.append(1) or compare(self, state)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = optim.sgd(lr=0.5)
    step = functrain.make_step(model, lambda m, b: m(b).square().mean(), opt, donate=True)
    state = functrain.init(model, opt, seed=0)  # the model's own tensors: the step runs in place
    for _ in range(3):
        state, _ = step(state, torch.ones(4, 3))
    assert len(calls) == 1  # later calls see the same tensor objects: no storage comparison
    # another state with the same names but its own tensors is not the model's: it trains
    # from its own values (plain SGD by hand), not from the model's
    w, b = torch.full((2, 3), 0.25), torch.tensor([1.0, -1.0])
    other = state.replace(params={"weight": w.clone(), "bias": b.clone()})
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    gw, gb = torch.autograd.grad((torch.ones(4, 3) @ wr.T + br).square().mean(), [wr, br])
    other, _ = step(other, torch.ones(4, 3))
    torch.testing.assert_close(other.params["weight"], w - 0.5 * gw)
    torch.testing.assert_close(other.params["bias"], b - 0.5 * gb)


def test_forward_seeds_differ_for_every_rank_and_microbatch():
    # dropout masks: no two (rank, microbatch) pairs of a step may share the global seed
    model = torch.nn.Linear(2, 2)
    opt = optim.sgd(lr=0.1)
    step = functrain.make_step(model, lambda m, b: m(b).mean(), opt)
    state = functrain.init(model, opt, seed=0)
    draws = set()
    for rank in range(3):
        for index in range(3):
            with step._grads_piece._forward_rng(state, rank, index):
                draws.add(float(torch.rand(())))
    assert len(draws) == 9


def test_microbatches_of_no_tokens_are_an_empty_batch_error():
    """Weights by tokens: microbatches holding 0 tokens in all are an empty batch (a ValueError,
    not a ZeroDivisionError)."""
    from functrain.step.grads import microbatch_weights
    from functrain.step.pieces import StepConfig

    config = StepConfig(weight_by="tokens", count_tokens=lambda mb: 0)
    with pytest.raises(ValueError, match="empty"):
        microbatch_weights([torch.zeros(2, 3), torch.zeros(2, 3)], config)
    assert microbatch_weights([torch.zeros(1), torch.zeros(3)], StepConfig()) == [0.25, 0.75]


def test_a_parameter_the_loss_does_not_use_gets_a_zero_gradient():
    """One microbatch of plain tensors (`torch.autograd.grad`): a trainable parameter outside the
    loss's graph is not an error; its gradient is zero, so plain SGD leaves it where it was."""
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 1), "unused": torch.nn.Linear(2, 1)})
    opt = optim.sgd(0.1)
    step = functrain.make_step(model, lambda m, b: m["used"](b).sum(), opt)
    state = functrain.init(model, opt, seed=0)
    before = tree_clone(state.params)
    x = torch.tensor([[1.0, 2.0]])
    new, _ = step(state, x)
    for k in ("unused.weight", "unused.bias"):
        assert torch.equal(new.params[k], before[k])
    # by hand: d(sum(w x + b))/dw = x, /db = 1
    assert torch.allclose(new.params["used.weight"], before["used.weight"] - 0.1 * x)
    assert torch.allclose(new.params["used.bias"], before["used.bias"] - 0.1)


def test_a_donating_step_without_a_fused_form_updates_the_models_own_parameters():
    """Donating from `init`, the state's params share the model's Parameters' storage; the
    transforms' own in-place path (clip_by_value has no fused form) keeps them so, as the fused
    path does: the model itself holds the trained weights (SGD steps by hand below)."""
    model = torch.nn.Linear(2, 1)
    opt = optim.chain(optim.clip_by_value(10.0), optim.sgd(0.1))
    step = functrain.make_step(model, lambda m, b: m(b).sum(), opt, donate=True)
    state = functrain.init(model, opt, seed=0)
    expected = model.weight.detach() - 0.1 * torch.tensor([[1.0, 2.0]])
    for _ in range(2):
        state, _ = step(state, torch.tensor([[1.0, 2.0]]))
        assert state.params["weight"].data_ptr() == model.weight.data_ptr()  # one storage
    assert torch.allclose(model.weight.detach(), expected - 0.1 * torch.tensor([[1.0, 2.0]]))


def test_a_state_with_its_params_in_another_order_swaps_each_into_its_own_slot():
    """A dict's order is no part of a state (a checkpoint reader may give sorted names): a step
    called with the names in one order and then in another puts every tensor in its own
    module slot both times (the slots are looked up again, not reused by position)."""
    model = torch.nn.Linear(2, 1)
    opt = optim.sgd(0.1)
    step = functrain.make_step(model, lambda m, b: m(b).sum(), opt)
    state = functrain.init(model, opt, seed=0)
    shuffled = state.replace(params=dict(sorted(state.params.items())))  # bias first
    assert list(shuffled.params) != list(state.params)
    x = torch.tensor([[1.0, 2.0]])
    expected = {"weight": state.params["weight"] - 0.1 * x, "bias": state.params["bias"] - 0.1}
    out = x @ state.params["weight"].T + state.params["bias"]  # by hand
    for s in (shuffled, state, shuffled):
        # the model run with a state's tensors (evaluation) takes the state's order ...
        assert torch.allclose(step.pieces.call_model(s, x), out)
        # ... the step's forward the trainable names' order
        new, metrics = step(s, x)
        assert torch.allclose(metrics["loss"], out.sum())
        assert tree_allclose(dict(new.params), expected, atol=1e-6)


def test_grad_mode_func_takes_the_gradients_with_torch_func(monkeypatch):
    """`grad_mode="func"` is `torch.func.grad` (composable with vmap, etc.), not autograd: the
    gradients come from it, and equal autograd's."""
    calls = []
    real = torch.func.grad

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.func, "grad", counting)
    x = torch.tensor([[1.0, 2.0]])
    results = {}
    for mode in ("func", "autograd"):
        torch.manual_seed(0)  # the same initial weights
        model = torch.nn.Linear(2, 1)
        opt = optim.sgd(0.1)
        step = functrain.make_step(model, lambda m, b: m(b).sum(), opt, grad_mode=mode)
        state = functrain.init(model, opt, seed=0)
        before = len(calls)
        results[mode], _ = step(state, x)
        assert (len(calls) > before) == (mode == "func")
    assert tree_allclose(results["func"].params, results["autograd"].params, atol=1e-6)
