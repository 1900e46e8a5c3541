"""Sequence-length warm-up: the length schedule, truncation, reshaping, end-of-sequence, purity."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.seq_length_warmup import set_batch_sequence_length, warmup_sequence_length


@settings(max_examples=50, deadline=None)
@given(
    max_batches=st.integers(1, 500),
    duration=st.floats(0.0, 1.0),
    lo=st.integers(1, 64),
    extra=st.integers(0, 256),
    step=st.integers(1, 16),
    b1=st.integers(0, 600),
    b2=st.integers(0, 600),
)
def test_length_grows_monotonically_within_bounds_and_ends_at_max(
    max_batches, duration, lo, extra, step, b1, b2
):
    hi = lo + extra
    first, second = sorted((b1, b2))
    l1 = warmup_sequence_length(first, max_batches, duration, lo, hi, step)
    l2 = warmup_sequence_length(second, max_batches, duration, lo, hi, step)
    assert lo <= l1 <= l2 <= hi
    assert (l1 - lo) % step == 0 or l1 == hi
    assert warmup_sequence_length(0, max_batches, duration, lo, hi, step) in (lo, hi)
    if int(max_batches * duration) == 0:
        assert l1 == hi  # no warm-up at all


def test_truncation_keeps_prefixes_and_leaves_the_input_alone():
    batch = {"input_ids": torch.arange(12).view(2, 6), "attention_mask": torch.ones(2, 6)}
    out = set_batch_sequence_length(batch, 4)
    assert torch.equal(out["input_ids"], torch.tensor([[0, 1, 2, 3], [6, 7, 8, 9]]))
    assert batch["input_ids"].shape == (2, 6)  # pure
    assert set_batch_sequence_length(batch, 6) is batch  # already short enough
    pair = (torch.arange(12).view(2, 6), torch.arange(12).view(2, 6) + 100)
    x, y = set_batch_sequence_length(pair, 3)
    assert torch.equal(y, x + 100) and x.shape == (2, 3)


def test_reshaping_keeps_every_whole_row_of_tokens():
    batch = {"input_ids": torch.arange(14).view(2, 7), "labels": torch.arange(14).view(2, 7)}
    out = set_batch_sequence_length(batch, 4, truncate=False)
    assert torch.equal(out["input_ids"], torch.arange(12).view(3, 4))
    assert torch.equal(out["labels"], out["input_ids"])
    with pytest.raises(ValueError, match="input_ids"):
        set_batch_sequence_length({"x": torch.zeros(2, 7)}, 4, truncate=False)


def test_end_of_sequence_is_preserved():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    out = set_batch_sequence_length(
        {"input_ids": ids, "attention_mask": mask}, 3, preserve_end_of_sequence=True
    )
    assert torch.equal(out["input_ids"], torch.tensor([[10, 11, 15], [20, 21, 22]]))
    with pytest.raises(ValueError, match="attention_mask"):
        set_batch_sequence_length({"input_ids": ids}, 3, preserve_end_of_sequence=True)
    with pytest.raises(ValueError, match="sequence-shaped"):
        set_batch_sequence_length({"input_ids": ids, "id": torch.arange(2)}, 3)


def test_default_schedule_matches_a_hand_computation():
    # Composer's defaults: duration 0.3, lengths 8..1024 in steps of 8. A 1000-batch run warms up
    # over int(1000 * 0.3) = 300 batches with (1024 - 8) // 8 = 127 increments, one every
    # 300 // 127 = 2 batches: length(b) = 8 * (b // 2) + 8, reaching 1024 at b = 254.
    expected = {0: 8, 1: 8, 2: 16, 3: 16, 101: 408, 253: 1016, 254: 1024, 300: 1024, 999: 1024}
    got = {b: warmup_sequence_length(b, 1000) for b in expected}
    assert got == expected


def test_schedule_with_explicit_arguments_matches_a_hand_computation():
    # int(100 * 0.5) = 50 warm-up batches, (64 - 16) // 8 = 6 increments, one every 50 // 6 = 8
    # batches: length(b) = 8 * (b // 8) + 16, capped at 64 from b = 48 on.
    expected = {0: 16, 7: 16, 8: 24, 15: 24, 16: 32, 47: 56, 48: 64, 99: 64}
    got = {b: warmup_sequence_length(b, 100, 0.5, 16, 64, 8) for b in expected}
    assert got == expected
    # Fewer warm-up batches (int(10 * 0.5) = 5) than increments (127): Composer's
    # `5 // 127 = 0` would divide by zero; the floor is one increment per batch.
    assert [warmup_sequence_length(b, 10, 0.5) for b in range(4)] == [8, 16, 24, 32]


def test_length_one_is_allowed_and_zero_is_rejected():
    batch = {"input_ids": torch.arange(6).view(2, 3), "attention_mask": torch.ones(2, 3)}
    out = set_batch_sequence_length(batch, 1)
    assert torch.equal(out["input_ids"], torch.tensor([[0], [3]]))
    flat = set_batch_sequence_length(batch, 1, truncate=False)
    assert torch.equal(flat["input_ids"], torch.arange(6).view(6, 1))
    with pytest.raises(ValueError, match="curr_seq_len must be >= 1"):
        set_batch_sequence_length(batch, 0)


def test_a_scalar_tensor_does_not_set_the_length_and_is_named_in_the_error():
    # The batch's length is dimension 1 of the first tensor with at least two dimensions; a 0-d
    # tensor before it must be skipped, then rejected by name (it cannot be truncated).
    batch = {"step": torch.tensor(3), "input_ids": torch.arange(12).view(2, 6)}
    with pytest.raises(ValueError, match="'step' has shape \\(\\)"):
        set_batch_sequence_length(batch, 4)
    with pytest.raises(ValueError, match="'step' has \\(\\)"):
        set_batch_sequence_length(batch, 4, truncate=False)
    pair = (torch.tensor(3), torch.arange(12).view(2, 6))
    with pytest.raises(ValueError, match="sequence-shaped"):
        set_batch_sequence_length(pair, 4)


def test_tuple_and_list_batches_keep_their_type_in_both_modes():
    ids = torch.arange(12).view(2, 6)
    for truncate, expected in ((True, ids[:, :4]), (False, torch.arange(12).view(3, 4))):
        pair = set_batch_sequence_length((ids, ids + 100), 4, truncate=truncate)
        assert type(pair) is tuple and len(pair) == 2
        assert torch.equal(pair[0], expected) and torch.equal(pair[1], expected + 100)
        listed = set_batch_sequence_length([ids, ids + 100], 4, truncate=truncate)
        assert type(listed) is list and torch.equal(listed[1], expected + 100)
