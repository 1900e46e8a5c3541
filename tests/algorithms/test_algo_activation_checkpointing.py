"""activation_checkpointing: the same gradients and trained parameters as the run without it (bit
for bit on CPU fp32, with dropout too), fewer saved activations, exactly the chosen blocks
recomputed, and a fit interrupted and resumed through a checkpoint Manager equal to the
uninterrupted one. The expected values are always the plain step's (no checkpointing)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import functrain
from bench.held_activations import held_activation_bytes
from functrain.algorithms import activation_checkpointing, label_smoothing
from functrain.algorithms.activation_checkpointing import ATTENTION_OPS, MATMUL_OPS
from functrain.checkpoint import Manager
from functrain.data import Loader
from functrain.models.gpt import GPT, Block, GPTConfig, gpt_loss

LAYERS = 4


def gpt(dropout=0.1) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=31, block_size=16, n_layer=LAYERS, n_head=2, n_embd=16,
                         dropout=dropout))  # fmt: skip


def batch(seed=0, size=4, length=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 31, (size, length), generator=g), torch.randint(
        0, 31, (size, length), generator=g
    )


def build(algorithm=None, dropout=0.1, **options):
    model = gpt(dropout)
    opt = functrain.optim.adamw(1e-2)
    step = functrain.make_step(model, gpt_loss, opt, **options)
    if algorithm is not None:
        step = functrain.compose(step, algorithm)
    return model, step, functrain.init(model, opt, seed=3)


def gradients(algorithm=None, dropout=0.1, **options):
    _, step, state = build(algorithm, dropout, **options)
    return step.pieces.grads(step.pieces, state, batch()).grads


def trained(algorithm=None, steps=3, dropout=0.1, **options):
    _, step, state = build(algorithm, dropout, **options)
    for i in range(steps):
        state, _ = step(state, batch(i))
    return state


def assert_identical(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: max difference {(a[k] - b[k]).abs().max()}"


def block_calls(algorithm, dropout=0.1) -> list[int]:
    """How many times each block's forward ran in one step (2: recomputed in backward)."""
    model, step, state = build(algorithm, dropout)
    counts = [0] * LAYERS
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda *a, i=i: counts.__setitem__(i, counts[i] + 1))
    step(state, batch())
    return counts


def kept_bytes(algorithm, dropout=0.0) -> int:
    """Bytes of activations held for backward at the end of one step's forward pass."""
    _, step, state = build(algorithm, dropout)
    return held_activation_bytes(step, state, batch(size=8))


PLAIN_GRADS = {}


def plain_grads(dropout):
    if dropout not in PLAIN_GRADS:
        PLAIN_GRADS[dropout] = gradients(None, dropout)
    return PLAIN_GRADS[dropout]


VARIANTS = {
    "full": lambda: activation_checkpointing(Block),
    "by_name": lambda: activation_checkpointing(names="blocks.*"),
    "every2": lambda: activation_checkpointing("Block", every=2),
    "selective": lambda: activation_checkpointing("Block", policy="selective"),
    "selective_ops": lambda: activation_checkpointing(
        "Block", policy="selective", save_ops=[torch.ops.aten.addmm.default]
    ),
}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gradients_are_bit_identical_to_the_plain_step(variant, dropout):
    assert_identical(gradients(VARIANTS[variant](), dropout), plain_grads(dropout))


def test_trained_parameters_are_bit_identical_with_microbatches_and_dropout():
    plain = trained(None, microbatch_size=2)
    assert_identical(trained(activation_checkpointing(Block), microbatch_size=2).params,
                     plain.params)  # fmt: skip


def test_bf16_autocast_recomputes_in_bf16_too():
    plain = trained(None, steps=2, precision="amp_bf16")
    assert_identical(trained(activation_checkpointing(Block), steps=2,
                             precision="amp_bf16").params, plain.params)  # fmt: skip


class FlatGPT(GPT):
    """Logits as `(tokens, vocab)`, the shape label smoothing's targets take."""

    def forward(self, idx):
        return super().forward(idx).flatten(0, 1)


def flat_loss(model, batch):
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(model(inputs), targets)


@pytest.mark.parametrize("order", ["inner", "outer"])
def test_composes_with_a_loss_wrapping_algorithm(order):
    def run(*algorithms):
        torch.manual_seed(0)
        model = FlatGPT(GPTConfig(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=16,
                                  dropout=0.1))  # fmt: skip
        opt = functrain.optim.adamw(1e-2)
        step = functrain.compose(functrain.make_step(model, flat_loss, opt), *algorithms)
        state = functrain.init(model, opt, seed=3)
        for i in range(2):
            x, y = batch(i)
            state, _ = step(state, (x, y.flatten()))
        return state.params

    smooth, checkpointing = label_smoothing(0.1), activation_checkpointing(Block)
    both = (checkpointing, smooth) if order == "inner" else (smooth, checkpointing)
    assert_identical(run(*both), run(smooth))


@pytest.mark.parametrize(
    "variant, expected",
    [("full", [2, 2, 2, 2]), ("every2", [1, 2, 1, 2]), ("selective", [2, 2, 2, 2])],
)
def test_exactly_the_chosen_blocks_are_recomputed(variant, expected):
    assert block_calls(None) == [1, 1, 1, 1]
    assert block_calls(VARIANTS[variant]()) == expected


def test_checkpointing_keeps_fewer_activations():
    plain = kept_bytes(None)
    full = kept_bytes(activation_checkpointing(Block))
    selective = kept_bytes(activation_checkpointing(Block, policy="selective"))
    every2 = kept_bytes(activation_checkpointing(Block, every=2))
    assert full < 0.5 * plain, (full, plain)  # 4 of 4 blocks keep only their inputs
    assert full < every2 < plain
    assert full < selective < plain  # it keeps attention's and every 2nd matmul's outputs
    every_matmul = kept_bytes(
        activation_checkpointing(Block, policy="selective", save_ops=MATMUL_OPS | ATTENTION_OPS)
    )
    assert selective < every_matmul < plain


@settings(max_examples=12)
@given(
    chosen=st.sets(st.integers(0, LAYERS - 1), min_size=1),
    every=st.integers(1, 3),
    policy=st.sampled_from(["full", "selective"]),
)
def test_any_choice_of_blocks_gives_the_plain_gradients(chosen, every, policy):
    names = [f"blocks.{i}" for i in sorted(chosen)]
    algorithm = activation_checkpointing(names=names, every=every, policy=policy)
    recomputed = {i for n, i in enumerate(sorted(chosen), start=1) if n % every == 0}
    expected = [2 if i in recomputed else 1 for i in range(LAYERS)]
    if not recomputed:
        return  # nothing checkpointed: construction is fine, the step is the plain one
    assert block_calls(algorithm) == expected
    assert_identical(gradients(algorithm), plain_grads(0.1))


class BNBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(6, 6), nn.BatchNorm1d(6)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


def test_batchnorm_statistics_are_updated_once_not_again_when_recomputed():
    def run(algorithm):
        torch.manual_seed(0)
        model = nn.Sequential(BNBlock(), BNBlock(), nn.Linear(6, 2))
        opt = functrain.optim.sgd(0.1)
        step = functrain.make_step(model, lambda m, b: m(b).square().mean(), opt)
        step = functrain.compose(step, algorithm) if algorithm else step
        state = functrain.init(model, opt)
        for i in range(2):
            state, _ = step(state, torch.randn(8, 6, generator=torch.Generator().manual_seed(i)))
        return state

    plain, checkpointed = run(None), run(activation_checkpointing(BNBlock))
    assert_identical(checkpointed.buffers, plain.buffers)
    assert_identical(checkpointed.params, plain.params)


def test_evaluation_runs_the_model_without_checkpointing():
    model, step, state = build(activation_checkpointing(Block))
    x, _ = batch()
    assert torch.equal(step.call_model(state, x), build(None)[1].call_model(state, x))


class CrashAt:
    def __init__(self, at):
        self.at = at

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.at:
            raise RuntimeError("simulated crash")


def test_an_interrupted_fit_resumes_bit_identically(tmp_path):
    def run(**options):
        _, step, state = build(activation_checkpointing(Block))
        x = torch.cat([batch(i)[0] for i in range(4)])
        y = torch.cat([batch(i)[1] for i in range(4)])
        data = Loader(torch.utils.data.TensorDataset(x, y), 4, seed=1)
        return functrain.fit(step, state, data, duration="6ba", progress=False, **options)

    whole = run()
    with Manager(tmp_path, every="2ba", async_save=False) as manager:
        with pytest.raises(functrain.CallbackError, match="simulated crash"):
            run(checkpoints=manager, callbacks=[CrashAt(5)])
    with Manager(tmp_path, every="2ba", async_save=False) as manager:
        resumed = run(checkpoints=manager, autoresume=True, return_result=True)
    assert resumed.resumed_from.endswith("step_000000004")
    assert_identical(resumed.state.params, whole.params)
    assert "activation_checkpointing" not in resumed.state.algo_state  # nothing of it is state


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="which modules"):
        activation_checkpointing()
    with pytest.raises(ValueError, match="every"):
        activation_checkpointing(Block, every=0)
    with pytest.raises(ValueError, match="policy"):
        activation_checkpointing(Block, policy="some")
    with pytest.raises(ValueError, match="save_ops"):
        activation_checkpointing(Block, save_ops=[torch.ops.aten.mm.default])
    with pytest.raises(ValueError, match="grad_mode='autograd'"):
        gradients(activation_checkpointing(Block), grad_mode="func")
    _, step, state = build(activation_checkpointing("Transformer"))
    with pytest.raises(ValueError, match="matched no module"):
        step(state, batch())


@pytest.mark.parametrize(
    "policy",
    ["full", pytest.param("selective", marks=pytest.mark.slow)],  # ~30 s to compile
)
def test_compile_step_with_checkpointing_matches_the_eager_step(policy):
    # SGD: the parameters differ from the eager run's as little as the gradients do
    def run(compiled):
        torch.manual_seed(0)  # 2 blocks: compiling is most of this test's time
        model = GPT(GPTConfig(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=16))
        opt = functrain.optim.sgd(0.1)
        step = functrain.compose(functrain.make_step(model, gpt_loss, opt),
                                 activation_checkpointing(Block, policy=policy))  # fmt: skip
        step = functrain.compile_step(step) if compiled else step
        state, _ = step(functrain.init(model, opt), batch(0))
        return state.params

    eager, compiled = run(False), run(True)
    for k in eager:
        torch.testing.assert_close(compiled[k], eager[k], rtol=1e-5, atol=1e-6)


class ThreeMatmuls(nn.Module):
    """An odd number of matmuls per block: every 2nd kept still gives the plain gradients."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return x + self.c(torch.relu(self.b(torch.tanh(self.a(x)))))


def test_selective_rule_agrees_between_forward_and_recomputation():
    def grads(algorithm):
        torch.manual_seed(0)
        model = nn.Sequential(ThreeMatmuls(), ThreeMatmuls(), nn.Linear(6, 1))
        opt = functrain.optim.sgd(0.1)
        step = functrain.make_step(model, lambda m, b: m(b).square().mean(), opt)
        step = functrain.compose(step, algorithm) if algorithm else step
        state = functrain.init(model, opt)
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
        return step.pieces.grads(step.pieces, state, x).grads

    assert_identical(grads(activation_checkpointing(ThreeMatmuls, policy="selective")), grads(None))


@pytest.mark.parametrize("method", ["block", "sample"])
def test_stochastic_depth_drops_the_same_blocks_when_recomputed(method):
    from functrain.algorithms import apply_surgery, stochastic_depth
    from functrain.models import SmallResNet

    def grads(*extra):
        torch.manual_seed(0)
        depth = stochastic_depth("ResidualBlock", stochastic_method=method, drop_rate=0.5)
        model = apply_surgery(SmallResNet(num_classes=3), [depth])
        opt = functrain.optim.sgd(0.1)
        loss = lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])  # noqa: E731
        step = functrain.compose(functrain.make_step(model, loss, opt), depth, *extra)
        state = functrain.init(model, opt, seed=5)
        g = torch.Generator().manual_seed(2)
        batch = (torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
        return step.pieces.grads(step.pieces, state, batch).grads

    assert_identical(grads(activation_checkpointing("StochasticBlock")), grads())


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.scale = nn.Linear(6, 6), 0.5

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class ReadsItsChildren(nn.Module):
    """A parent that reads an attribute and a submodule of its checkpointed children."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Scaled(), Scaled()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) * layer.scale + 0.1 * layer.fc.bias.sum()
        return x.square().mean()


def test_a_parent_still_reads_its_checkpointed_childrens_attributes():
    def grads(*algorithms):
        torch.manual_seed(0)
        model = ReadsItsChildren()
        opt = functrain.optim.sgd(0.1)
        step = functrain.compose(functrain.make_step(model, lambda m, b: m(b), opt), *algorithms)
        state = functrain.init(model, opt)
        return step.pieces.grads(step.pieces, state, torch.ones(3, 6)).grads

    assert_identical(grads(activation_checkpointing(Scaled)), grads())
