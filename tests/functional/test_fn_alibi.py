"""ALiBi: geometric slopes, causal linear biases, embedding removed, batch reshaped losslessly."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.alibi import alibi_slopes, apply_alibi, scale_sequence_length
from functrain.models import GPT, GPTConfig, alibi_bias


def test_slopes_match_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    s6 = alibi_slopes(6)  # not a power of two: 4 geometric, then every other one of the 8-series
    expected = [2 ** (-2 * (i + 1)) for i in range(4)] + [2 ** (-1 * (i + 1)) for i in range(8)][
        0::2
    ][:2]
    torch.testing.assert_close(s6, torch.tensor(expected))
    with pytest.raises(ValueError):
        alibi_slopes(0)


@settings(max_examples=20, deadline=None)
@given(n_head=st.integers(1, 8), length=st.integers(1, 12))
def test_bias_is_linear_in_distance_and_causal(n_head, length):
    slopes = alibi_slopes(n_head)
    bias = alibi_bias(slopes, length)
    i, j = torch.tril_indices(length, length)
    torch.testing.assert_close(bias[:, i, j], -slopes[:, None] * (i - j).float())
    assert bool(
        torch.isinf(bias[:, torch.triu(torch.ones(length, length, dtype=torch.bool), 1)]).all()
    )


def test_apply_alibi_removes_positions_and_keeps_causality():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=3, n_embd=12)).eval()
    new = apply_alibi(model, max_sequence_length=32).eval()
    assert model.wpe is not None and new.wpe is None
    assert (
        sum(p.numel() for p in new.parameters())
        == sum(p.numel() for p in model.parameters()) - 8 * 12
    )
    assert new.blocks[0].attn.alibi_slopes.shape == (3,)
    x = torch.randint(0, 11, (2, 24))
    y = x.clone()
    y[:, 12:] = (y[:, 12:] + 1) % 11  # change the future only
    torch.testing.assert_close(new(x)[:, :12], new(y)[:, :12])
    with pytest.raises(ValueError, match="longer"):
        new(torch.zeros(1, 33, dtype=torch.long))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), length_log2=st.integers(1, 5), scale_log2=st.integers(0, 3))
def test_sequence_scaling_keeps_every_token_in_order(rows, length_log2, scale_log2):
    length, scaling = 2**length_log2, 2.0**-scale_log2
    if length * scaling < 1:
        return
    x = torch.arange(rows * length).reshape(rows, length)
    batch = {"input_ids": x, "labels": x + 1}
    out = scale_sequence_length(batch, scaling)
    assert out["input_ids"].shape == (rows * round(1 / scaling), round(length * scaling))
    assert torch.equal(out["input_ids"].flatten(), x.flatten())
    assert torch.equal(out["labels"] - out["input_ids"], torch.ones_like(out["input_ids"]))
    assert batch["input_ids"] is x  # input untouched


def test_sequence_scaling_errors():
    with pytest.raises(ValueError, match="divides"):
        scale_sequence_length((torch.zeros(2, 6), torch.zeros(2, 6)), 0.25)
    with pytest.raises(ValueError, match="same"):
        scale_sequence_length((torch.zeros(2, 8), torch.zeros(2)), 0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        scale_sequence_length(torch.zeros(2, 8), 2.0)
    assert math.isclose(float(alibi_slopes(1)[0]), 2.0**-8)


def test_sequence_scaling_rejects_what_cannot_be_cut_evenly():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        scale_sequence_length(torch.zeros(2, 8), 0.0)
    # 6 * 2/3 = 4 is a whole length, but 4 does not divide 6
    with pytest.raises(ValueError, match="divides it; choose a scaling such as 0.5 or 0.25"):
        scale_sequence_length(torch.zeros(2, 6), 2 / 3)
    with pytest.raises(ValueError, match="divides"):  # 8 * 0.01 rounds to a length of 0
        scale_sequence_length(torch.zeros(2, 8), 0.01)
    # (4, 4) has as many entries as (2, 8) and would reshape silently: its rows are not the batch's
    with pytest.raises(ValueError, match=r"same \(batch, sequence\).*\(4, 4\)"):
        scale_sequence_length({"input_ids": torch.zeros(2, 8), "other": torch.zeros(4, 4)}, 0.5)


def test_only_modules_with_the_alibi_slot_are_attention():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    model.counter = torch.nn.Module()
    model.counter.n_head = 2  # has n_head but no `alibi_slopes` slot: not an attention module
    new = apply_alibi(model, max_sequence_length=1)  # a length of 1 is a valid maximum
    assert not hasattr(new.counter, "alibi_slopes") and new.max_sequence_length == 1
    assert new.blocks[0].attn.alibi_slopes.shape == (2,)
    lone = torch.nn.Module()
    lone.n_head = 2
    with pytest.raises(ValueError, match="found no attention module"):
        apply_alibi(lone, max_sequence_length=8)
    with pytest.raises(ValueError, match="max_sequence_length must be positive"):
        apply_alibi(model, max_sequence_length=0)


def test_sequence_scaling_needs_sequence_shaped_tensors():
    with pytest.raises(ValueError, match="needs a batch of \\(batch, sequence\\) tensors"):
        scale_sequence_length((torch.zeros(8), torch.zeros(2, 8)), 0.5)
    with pytest.raises(ValueError, match="needs a batch of"):
        scale_sequence_length({"step": 3}, 0.5)  # no tensor at all
