"""The code of docs/writing_an_algorithm.md runs, and the tests it shows pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing_an_algorithm.md"
DOC_TESTS = [
    "test_lookahead_laws",
    "test_lookahead_moves_the_slow_weights_by_alpha",
    "test_weight_noise_laws",
]


@pytest.fixture(scope="module")
def namespace():
    """The page's `python` blocks run in order in one namespace, as a reader would paste them."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    names: dict = {"__name__": "writing_an_algorithm"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name} (python block {index})", "exec"), names)  # noqa: S102
    return names


def test_the_page_defines_its_tests(namespace):
    assert sorted(n for n in namespace if n.startswith("test_")) == sorted(DOC_TESTS)


@pytest.mark.parametrize("name", DOC_TESTS)
def test_the_pages_tests_pass(namespace, name):
    namespace[name]()


def test_the_wrapped_loss_example_scales_the_gradients(namespace):
    import torch

    import functrain

    model, loss_fn, optimizer = namespace["model"], namespace["loss_fn"], namespace["optimizer"]
    batch = namespace["batch"]
    state = functrain.init(model, optimizer, seed=0)
    plain = functrain.make_step(model, loss_fn, optimizer)
    scaled = functrain.compose(plain, namespace["scale_loss"](2.0))
    _, m1 = plain(state, batch)
    _, m2 = scaled(state, batch)
    torch.testing.assert_close(m2["loss"], 2 * m1["loss"])
    torch.testing.assert_close(m2["grad_norm"], 2 * m1["grad_norm"])
