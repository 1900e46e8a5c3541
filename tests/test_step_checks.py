"""Inputs checked before kernels: an optimizer state that does not fit the parameters, bad
options, and surgery algorithms composed without their surgery."""

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import functrain
from functrain import algorithms as A
from functrain import optim
from functrain.models import SmallResNet
from functrain.step import checks as step_checks


def mlp(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 2)
    )


def ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


BATCH = (torch.randn(5, 4), torch.randint(0, 2, (5,)))


def test_an_optimizer_state_of_a_smaller_model_is_a_clear_error_not_a_crash():
    # In a child process: before the check, the fused AdamW kernel read past the moments' end
    # (SIGSEGV), which would take the test run down with it.
    code = textwrap.dedent(
        """
        import torch, torch.nn.functional as F, functrain
        from functrain import optim
        def mlp(width):
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, 2))
        big, small = mlp(4096), mlp(2)
        opt = optim.adamw(lr=1e-3)
        state = functrain.init(big, opt)
        state = state.replace(opt_state=functrain.init(small, opt).opt_state)
        step = functrain.make_step(big, lambda m, b: F.cross_entropy(m(b[0]), b[1]), opt,
                                   donate=True)
        try:
            step(state, (torch.randn(5, 4), torch.randint(0, 2, (5,))))
        except ValueError as error:
            print("ERROR:", error)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "opt_state.0.mu.0.weight has shape (2, 4) but parameter '0.weight'" in done.stdout
    assert "functrain.init(model, optimizer)" in done.stdout


@pytest.mark.parametrize("donate", [False, True])
def test_a_bigger_or_differently_typed_optimizer_state_is_rejected(donate):
    model = mlp(3)
    opt = optim.adamw(lr=1e-3)
    state = functrain.init(model, opt)
    step = functrain.make_step(model, ce, opt, donate=donate)
    bigger = state.replace(opt_state=functrain.init(mlp(8), opt).opt_state)
    with pytest.raises(ValueError, match=r"opt_state\.0\.mu\.2\.weight has shape \(2, 8\)"):
        step(bigger, BATCH)
    doubled = state.replace(
        opt_state=functrain.init(mlp(3).double(), opt).opt_state
    )  # same shapes, float64 moments for float32 parameters
    with pytest.raises(ValueError, match=r"opt_state\.0\.mu\.0\.bias is torch\.float64"):
        step(doubled, BATCH)
    renamed = state.replace(
        opt_state=optim.adamw(lr=1e-3).init({**dict(state.params), "extra": torch.zeros(1)})
    )
    with pytest.raises(ValueError, match="'extra', no trainable parameter"):
        step(renamed, BATCH)


def test_the_check_runs_for_states_the_step_did_not_produce_not_on_every_call(monkeypatch):
    seen = []
    real = step_checks.check_opt_state

    def counting(opt_state, params, layout=None):
        seen.append(1)
        return real(opt_state, params, layout)

    monkeypatch.setattr("functrain.step.plan.check_opt_state", counting)
    for donate in (False, True):
        seen.clear()
        model = mlp(3)
        opt = optim.adamw(lr=1e-3)
        state = functrain.init(model, opt)
        step = functrain.make_step(model, ce, opt, donate=donate)
        for _ in range(5):
            state, _ = step(state, BATCH)
        assert len(seen) == 1  # the first state; later ones are the step's own outputs
        # A state it did not produce (same structure, wrong shapes) is checked again.
        wrong = state.replace(opt_state=functrain.init(mlp(5), opt).opt_state)
        with pytest.raises(ValueError, match="does not fit the parameters"):
            step(wrong, BATCH)
        assert len(seen) == 2


def test_microbatch_size_true_is_rejected():
    model = mlp(3)
    opt = optim.sgd(lr=0.1)
    with pytest.raises(ValueError, match="microbatch_size must be a positive int"):
        functrain.make_step(model, ce, opt, microbatch_size=True)
    step = functrain.make_step(model, ce, opt)
    with pytest.raises(ValueError, match="microbatch_size"):
        step.with_options(microbatch_size=False)


def cnn():
    torch.manual_seed(0)
    return SmallResNet(widths=(16, 32), stem_pool=True)


@pytest.mark.parametrize(
    "algorithm",
    [A.blurpool(), A.channels_last(), A.squeeze_excite(latent_channels=4, min_channels=16)],
    ids=["blurpool", "channels_last", "squeeze_excite"],
)
def test_a_surgery_algorithm_without_apply_surgery_is_a_clear_error(algorithm):
    opt = optim.sgd(lr=0.1)
    model = cnn()
    step = functrain.make_step(model, ce, opt)
    with pytest.raises(ValueError, match=rf"{algorithm.name}'s model surgery has not been applied"):
        functrain.compose(step, algorithm)
    # The documented flow: surgery before init, then the same algorithms in compose.
    model = A.apply_surgery(cnn(), [algorithm])
    state = functrain.init(model, opt)
    step = functrain.compose(functrain.make_step(model, ce, opt), algorithm)
    state, metrics = step(state, (torch.randn(2, 1, 16, 16), torch.tensor([0, 1])))
    assert torch.isfinite(metrics["loss"])


def test_a_whole_recipe_after_apply_surgery_composes_and_nothing_to_change_is_fine():
    recipe = [
        A.blurpool(),
        A.channels_last(),
        A.squeeze_excite(latent_channels=4, min_channels=16),
        A.factorize(min_channels=16, latent_channels=4, min_features=16, latent_features=4),
        A.ema(half_life="10ba"),
    ]
    model = A.apply_surgery(cnn(), recipe)
    functrain.compose(functrain.make_step(model, ce, optim.sgd(lr=0.1)), *recipe)
    # BlurPool on a model without strided convolutions or pooling has nothing to do: no error.
    functrain.compose(functrain.make_step(mlp(3), ce, optim.sgd(lr=0.1)), A.blurpool())


def test_compose_of_a_compiled_step_says_to_compose_first():
    step = functrain.make_step(mlp(3), ce, optim.sgd(lr=0.1))
    with pytest.raises(TypeError, match=r"compile_step\(compose\(step, \.\.\.\)\)"):
        functrain.compose(functrain.compile_step(step), A.ema())
    with pytest.raises(TypeError, match="make_step"):
        functrain.compose(lambda state, batch: (state, {}), A.ema())
