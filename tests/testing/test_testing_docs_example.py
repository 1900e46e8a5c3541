"""docs/testing_transforms.md: its example runs as written, and each planted bug is caught.

The example's code blocks are read from the page itself, so the page and this test cannot drift
apart; each bug is planted by replacing one line of the page's code.
"""

import re
from pathlib import Path

import pytest

from functrain.testing import LawError, check_determinism, check_purity

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing_transforms.md"


def example_source() -> str:
    """The page's python blocks that define the algorithm, the transform and their tests."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    wanted = [
        b
        for b in blocks
        if re.search(r"^def (input_noise|add_l2|test_input_noise_laws)\(", b, flags=re.M)
    ]
    assert len(wanted) == 3, "the page's example should be 3 blocks: algorithm, transform, tests"
    return "\n".join(wanted)


def load(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, str(DOC), "exec"), namespace)
    return namespace


def test_the_example_passes_as_written():
    example = load(example_source())
    example["test_input_noise_laws"]()
    example["test_add_l2_laws"]()


PLANTED = {
    "in-place batch": (
        "return x + std * noise, y",
        "return x.add_(std * noise), y",
        lambda ex: check_purity(ex["input_noise"](0.1)),
        "purity",
        "modified its input batch",
    ),
    "key ignored": (
        "noise = torch.randn(x.shape, generator=generator)",
        "noise = torch.randn(x.shape)",
        lambda ex: check_determinism(ex["input_noise"](0.1)),
        "determinism",
        "same state and key differ",
    ),
    "fixed generator": (
        'generator = key_for(state.rng, state.step, "input_noise")',
        "generator = torch.Generator().manual_seed(0)",
        lambda ex: check_determinism(ex["input_noise"](0.1), varies_with_key=True),
        "determinism",
        "ignores the key",
    ),
    "in-place grads": (
        "return {k: g + strength * params[k] for k, g in grads.items()}, state",
        "return {k: g.add_(strength * params[k]) for k, g in grads.items()}, state",
        lambda ex: check_purity(ex["add_l2"](0.01)),
        "purity",
        "modified its input grads",
    ),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_caught_with_a_readable_message(bug):
    line, planted, check, law, words = PLANTED[bug]
    source = example_source()
    assert line in source, f"the page no longer has the line this test plants a bug in: {line}"
    buggy = load(source.replace(line, planted))
    with pytest.raises(LawError) as info:
        check(buggy)
    error = info.value
    assert error.law == law
    assert isinstance(error, AssertionError)
    message = str(error)
    assert f"law '{law}'" in message and words in message
    assert "Case(" in message  # the minimal example is named
    if law == "purity":  # the leaf that moved, and by how much
        assert "leaf " in message and "max abs difference" in message
