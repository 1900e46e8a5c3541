"""docs/coming_from_lightning.md names things that exist, and its OneCycle-with-Adam snippet runs."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "coming_from_lightning.md"


def resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


NAMES = sorted(set(re.findall(r"\bfunctrain(?:\.[A-Za-z_]\w*)+", DOC.read_text())))


@pytest.mark.parametrize("dotted", NAMES)
def test_every_functrain_name_exists(dotted):
    assert resolve(dotted) is not None


def test_the_checkpoint_row_uses_the_managers_real_arguments():
    import inspect

    from functrain.checkpoint import Manager

    text = DOC.read_text()
    assert "keep_last=3)` | " not in text  # top-k is not last-k (issue 31)
    parameters = inspect.signature(Manager).parameters
    for argument in re.findall(r"Manager\(root, ([^)]*)\)", text):
        for name in re.findall(r"(\w+)=", argument):
            assert name in parameters, name


def test_the_one_cycle_adam_snippet_runs_and_cycles_beta1():
    block = re.search(
        r"```python\n(\s*from functrain import optim, schedules.*?)```", DOC.read_text(), re.S
    )
    code = "\n".join(
        line[2:] if line.startswith("  ") else line for line in block.group(1).splitlines()
    )
    names: dict = {}
    exec(code, names)  # noqa: S102
    opt = names["opt"]
    from functrain.units import Timestamp

    params = {"w": torch.ones(3)}
    state = opt.init(params)
    betas = []
    for batch in range(10):
        _, state = opt.update(
            {"w": torch.ones(3)}, state, params, time=Timestamp(batch=batch, max_batches=10)
        )
        betas.append(state[0].hyperparams["b1"])
    assert (
        betas[0] == 0.95 and min(betas) == pytest.approx(0.85) and betas[-1] == pytest.approx(0.95)
    )
