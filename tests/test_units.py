"""Time and Timestamp: parsing and printing, same-unit arithmetic, horizon conversions."""

import math

import numpy as np
import optree
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.tree import NAMESPACE, leaves_with_paths
from functrain.units import ACCEPTED_FORMS, Time, Timestamp, TimeUnit

COUNT_UNITS = ["ep", "ba", "sp", "tok"]
ALL_UNITS = [u.value for u in TimeUnit]

counts = st.integers(min_value=0, max_value=10**15)
fractions = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@st.composite
def times(draw, units=ALL_UNITS):
    unit = draw(st.sampled_from(units))
    value = draw(st.one_of(counts, fractions)) if unit in COUNT_UNITS else draw(fractions)
    return Time(value, unit)


# ---- parsing and printing ----------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(times())
def test_str_round_trips_for_every_unit(t):
    assert Time.from_str(str(t)) == t
    assert Time.coerce(str(t)) == t


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(COUNT_UNITS), counts)
def test_counts_print_as_whole_numbers(unit, n):
    # "%g" once printed 1234567 batches as "1.23457e+06ba"; the text must keep every digit.
    assert str(Time(n, unit)) == f"{n}{unit}"


@pytest.mark.parametrize(
    "text, value, unit",
    [
        ("1ep", 1, "ep"),
        ("100ba", 100, "ba"),
        ("2048sp", 2048, "sp"),
        ("1e6tok", 10**6, "tok"),
        ("0.5dur", 0.5, "dur"),
        ("90sec", 90.0, "sec"),
        (" 12 ba ", 12, "ba"),
        ("1.5ep", 1.5, "ep"),
    ],
)
def test_from_str_simple_forms(text, value, unit):
    t = Time.from_str(text)
    assert (t.value, t.unit) == (value, TimeUnit(unit))


@pytest.mark.parametrize(
    "text, seconds",
    [("1h30m", 5400), ("2m", 120), ("1h30m15s", 5415), ("45s", 45), ("1.5h", 5400), ("90sec", 90)],
)
def test_clock_forms_are_seconds(text, seconds):
    assert Time.from_str(text) == Time(seconds, "sec")


def test_one_and_a_half_hours_is_5400_seconds():
    assert Time.from_str("1h30m") == Time.from_str("5400sec") == Time(5400, TimeUnit.SECOND)
    assert Time.from_str("1h30m").value == 5400


@pytest.mark.parametrize(
    "text", ["", "ba", "10", "10 batches", "-3ep", "1h30x", "3 ep ba", "1e6", "10BA", "1..5ep"]
)
def test_malformed_strings_list_the_accepted_forms(text):
    with pytest.raises(ValueError) as info:
        Time.from_str(text)
    message = str(info.value)
    assert repr(text) in message
    assert ACCEPTED_FORMS in message
    for example in ('"3ep"', '"100ba"', '"2048sp"', '"1e6tok"', '"0.5dur"', '"1h30m"'):
        assert example in message


def test_from_str_rejects_non_strings():
    with pytest.raises(TypeError, match="expects a string"):
        Time.from_str(100)


def test_coerce():
    assert Time.coerce(7) == Time(7, "ba")
    assert Time.coerce(np.int64(7)) == Time(7, "ba")
    assert Time.coerce("3ep") == Time(3, "ep")
    t = Time(2, "tok")
    assert Time.coerce(t) is t
    for bad in (1.5, True, None, [1]):
        with pytest.raises(TypeError, match="int of batches"):
            Time.coerce(bad)


def test_constructor_validation():
    with pytest.raises(ValueError, match="unknown time unit 'epochs'"):
        Time(1, "epochs")
    with pytest.raises(ValueError, match="cannot be negative"):
        Time(-1, "ba")
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            Time(bad, "ba")
    for bad in ("5", True, None):
        with pytest.raises(TypeError, match="real number"):
            Time(bad, "ba")


def test_values_are_normalised():
    assert type(Time(3.0, "ep").value) is int
    assert type(Time(np.int32(3), "ba").value) is int
    assert Time(1.5, "ba").value == 1.5
    assert type(Time(1, "dur").value) is float and type(Time(90, "sec").value) is float
    assert Time(1, "dur") == Time.from_str("1dur")
    assert hash(Time(2, "ep")) == hash(Time.from_str("2ep"))
    assert repr(Time(120, "ba")) == "Time(120, 'ba')"


# ---- arithmetic and comparison -----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(COUNT_UNITS), counts, counts)
def test_same_unit_arithmetic_and_comparison(unit, a, b):
    ta, tb = Time(a, unit), Time(b, unit)
    assert ta + tb == Time(a + b, unit)
    assert ta + f"{b}{unit}" == Time(a + b, unit)
    hi, lo = max(ta, tb, key=lambda t: t.value), min(ta, tb, key=lambda t: t.value)
    assert hi - lo == Time(hi.value - lo.value, unit)
    assert 3 * ta == ta * 3 == Time(3 * a, unit)
    assert (ta < tb) == (a < b) and (ta <= tb) == (a <= b)
    assert (ta > tb) == (a > b) and (ta >= tb) == (a >= b)
    assert (ta == tb) == (a == b)
    if b:
        assert ta / tb == a / b
        assert ta / 2 == Time(a / 2, unit)


def test_int_operand_means_batches():
    assert Time(10, "ba") + 5 == Time(15, "ba")
    assert Time(10, "ba") > 5
    with pytest.raises(ValueError, match="units differ"):
        Time(10, "ep") + 5


@settings(max_examples=30, deadline=None)
@given(times(), times())
def test_mixing_units_raises(a, b):
    if a.unit is b.unit:
        return
    for op, verb in [
        (lambda: a + b, "add"),
        (lambda: a - b, "subtract"),
        (lambda: a / b, "divide"),
        (lambda: a < b, "compare"),
        (lambda: a <= b, "compare"),
        (lambda: a > b, "compare"),
        (lambda: a >= b, "compare"),
    ]:
        with pytest.raises(ValueError, match=f"cannot {verb} .*units differ"):
            op()
    assert a != b  # equality across units is simply False, like any two different values


def test_bad_products_and_differences():
    with pytest.raises(TypeError):
        Time(1, "ba") * Time(2, "ba")
    with pytest.raises(TypeError):
        Time(1, "ba") * "3"
    with pytest.raises(ValueError, match="negative"):
        Time(1, "ba") - Time(2, "ba")


# ---- Timestamp ---------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 64), st.integers(0, 4096), st.booleans()),
        min_size=0,
        max_size=30,
    )
)
def test_advance_batch_and_epoch_count_totals_and_per_epoch(events):
    ts = Timestamp()
    since_epoch = [0, 0, 0]
    epochs = 0
    for samples, tokens, ends_epoch in events:
        ts = ts.advance_batch(samples, tokens)
        since_epoch = [since_epoch[0] + 1, since_epoch[1] + samples, since_epoch[2] + tokens]
        if ends_epoch:
            ts = ts.advance_epoch()
            epochs += 1
            since_epoch = [0, 0, 0]
    assert ts.batch == len(events)
    assert ts.sample == sum(e[0] for e in events)
    assert ts.token == sum(e[1] for e in events)
    assert ts.epoch == epochs
    assert [ts.batch_in_epoch, ts.sample_in_epoch, ts.token_in_epoch] == since_epoch


def test_advance_is_pure_and_keeps_the_horizon():
    ts = Timestamp(batches_per_epoch=10, max_batches=100, elapsed_sec=3.0)
    after = ts.advance_batch(samples=8, tokens=80).advance_epoch()
    assert ts.batch == 0 and ts.epoch == 0
    assert (after.batches_per_epoch, after.max_batches, after.elapsed_sec) == (10, 100, 3.0)
    assert after.replace(elapsed_sec=9.5).elapsed_sec == 9.5


def test_get_each_unit():
    ts = Timestamp(epoch=2, batch=30, sample=960, token=9600, elapsed_sec=12.5, max_batches=120)
    assert [ts.get(u) for u in ("ep", "ba", "sp", "tok", "sec")] == [2, 30, 960, 9600, 12.5]
    assert ts.get(TimeUnit.DURATION) == 0.25
    with pytest.raises(ValueError, match="unknown time unit 'batches'.*ba"):
        ts.get("batches")
    with pytest.raises(ValueError, match="max_batches is unknown"):
        Timestamp(batch=3).get("dur")


def test_to_batches():
    ts = Timestamp(batch=4, sample=128, token=4096, batches_per_epoch=50, max_batches=500)
    assert ts.to_batches("7ba") == 7
    assert ts.to_batches(7) == 7
    assert ts.to_batches("2ep") == 100
    assert ts.to_batches("1.5ep") == 75
    assert ts.to_batches("0.5dur") == 250
    assert ts.to_batches("320sp") == 10  # 32 samples a batch so far
    assert ts.to_batches("2048tok") == 2
    with pytest.raises(ValueError, match="wall-clock"):
        ts.to_batches("30sec")


def test_to_batches_says_what_is_missing():
    with pytest.raises(ValueError, match="batches_per_epoch is unknown.*duration="):
        Timestamp().to_batches("1ep")
    with pytest.raises(ValueError, match="max_batches is unknown.*duration="):
        Timestamp().to_batches("1dur")
    with pytest.raises(ValueError, match="no sp counted so far"):
        Timestamp().to_batches("64sp")


def test_reached():
    ts = Timestamp(
        epoch=1, batch=4, sample=128, token=4096, elapsed_sec=61.0, batches_per_epoch=3
    ).replace(max_batches=12)
    assert ts.reached("4ba") and not ts.reached("5ba")
    assert ts.reached("1ep") and not ts.reached("2ep")
    assert ts.reached("128sp") and not ts.reached("129sp")
    assert ts.reached("4096tok") and not ts.reached("4097tok")
    assert ts.reached("1m") and not ts.reached("2m")
    assert ts.reached(4)
    # "dur" is reached at the first whole batch at or past the fraction: 0.3 * 12 = 3.6 -> 4.
    assert ts.reached("0.3dur") and not ts.reached("0.34dur")
    # 1/3 of 12 batches is 4 batches even though 0.333... * 12 rounds to 3.9999999999999996.
    assert ts.reached(Time(1 / 3, "dur"))


def test_timestamp_is_a_pytree_with_named_leaves():
    ts = Timestamp(epoch=1, batch=7, max_batches=9)
    paths = dict(leaves_with_paths(ts))
    assert paths["batch"] == 7 and paths["epoch"] == 1 and paths["max_batches"] == 9
    leaves, spec = optree.tree_flatten(ts, namespace=NAMESPACE)
    assert optree.tree_unflatten(spec, leaves) == ts


def test_docstring_examples_run():
    import doctest

    import functrain.units

    assert doctest.testmod(functrain.units).failed == 0


# -- mutation-testing survivors of functrain/time.py (bench mutants, issue 17) ------------------


def test_huge_whole_numbers_print_in_exponent_form_and_round_trip():
    assert str(Time(1e17, "sec")) == "1e+17sec"  # not "100000000000000000sec"
    assert str(Time(2.0**53, "sec")) == "9007199254740992sec"  # below 1e16: as an integer
    assert Time.from_str(str(Time(1e17, "sec"))) == Time(1e17, "sec")


def test_a_bool_is_no_time_factor():
    with pytest.raises(TypeError):
        Time(3, "ba") * True
    with pytest.raises(TypeError):
        True * Time(3, "ba")
    assert Time(3, "ba") * 2 == Time(6, "ba")


def test_a_timestamp_is_immutable_and_starts_at_zero():
    import dataclasses

    ts = Timestamp()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ts.batch = 3
    assert ts.elapsed_sec == 0.0 and ts.advance_batch(samples=4).elapsed_sec == 0.0
    assert all(getattr(ts, f.name) == 0 for f in dataclasses.fields(ts))
