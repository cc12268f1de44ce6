"""The catch-up window's rule among a job's options (``schedapp.option_rules``): a duration of
more than 0, at most a year, and not shorter than the misfire grace; None is no window."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp.option_rules import OPTION_FIELDS, options_verdict
from schedapp.policies import MAX_DELAY
from tests import examples

VALID = {
    "queue": "",
    "priority": 0,
    "max_retries": 3,
    "jitter": 0,
    "lease_seconds": 60,
    "misfire_max_catchup": 100,
    "retry_backoff": timedelta(seconds=10),
    "retry_backoff_max": timedelta(hours=1),
    "misfire_grace": timedelta(minutes=1),
    "misfire_policy": "run_once",
    "when_retries_exhausted": "dead",
    "catchup_window": None,
    "overlap": "buffer_one",
    "max_buffer": 100,
    "fixed_delay": False,
    "max_concurrent": 10,
    "start_deadline": None,
    "skip_late": False,
    "max_runtime": None,
    "revoke_overrun": False,
    "finish_by": None,
    "alert_after_failures": None,
}
assert set(VALID) == set(OPTION_FIELDS)


def verdict(**given: object):
    return options_verdict(tuple({**VALID, **given}[f] for f in OPTION_FIELDS))


def as_duration(value: object) -> timedelta | None:
    """What the rule reads ``value`` as, independently of it: None when it is no duration."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    try:
        return timedelta(seconds=value)
    except OverflowError:
        return None


windows = st.one_of(
    st.none(),
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=400)),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=5),
)
graces = st.timedeltas(min_value=timedelta(0), max_value=MAX_DELAY)


@settings(max_examples=examples(300), deadline=None)
@given(window=windows, grace=graces)
def test_property_a_window_is_kept_exactly_when_a_positive_duration_not_under_the_grace(
    window, grace
):
    result = verdict(catchup_window=window, misfire_grace=grace)
    duration = as_duration(window)
    valid = window is None or (
        duration is not None and timedelta(0) < duration <= MAX_DELAY and duration >= grace
    )
    if valid:
        assert result.errors == ()
        assert result.values["catchup_window"] == duration
        assert result.values["misfire_grace"] == grace  # the window never changes the grace
    else:
        # refused with one message, naming the window only: the grace is valid
        assert [field for field, _ in result.errors] == ["catchup_window"]
        assert "catchup_window" not in result.values


def test_each_refusal_says_what_is_wrong():
    said = {
        "zero": verdict(catchup_window=0).errors,
        "negative": verdict(catchup_window=timedelta(seconds=-1)).errors,
        "over a year": verdict(catchup_window=MAX_DELAY + timedelta(microseconds=1)).errors,
        "under the grace": verdict(catchup_window=59.999999).errors,
        "a string": verdict(catchup_window="3600").errors,
    }
    assert said == {
        "zero": (("catchup_window", "must be more than 0 (None: no window)."),),
        "negative": (("catchup_window", "must be more than 0 (None: no window)."),),
        "over a year": (("catchup_window", "must be at most a year."),),
        "under the grace": (
            (
                "catchup_window",
                "must not be shorter than misfire_grace (0:01:00): only occurrences missed "
                "by more than the grace are looked at, so a shorter window could never act.",
            ),
        ),
        "a string": (
            ("catchup_window", "must be a duration (timedelta or seconds), or None for no window."),
        ),
    }


def test_an_invalid_grace_is_said_once_and_the_window_is_judged_alone():
    result = verdict(misfire_grace=-5, catchup_window=30)
    assert [field for field, _ in result.errors] == ["misfire_grace"]
    assert result.values["catchup_window"] == timedelta(seconds=30)


anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        ["skip", "buffer_one", "buffer_all", "cancel_other", "terminate_other", "allow_all", "SKIP"]
    ),
)


@settings(max_examples=examples(300), deadline=None)
@given(overlap=anything, max_buffer=anything, fixed_delay=anything, max_concurrent=anything)
def test_property_overlap_options_are_kept_exactly_when_valid_and_refused_by_name(
    overlap, max_buffer, fixed_delay, max_concurrent
):
    given_value = {
        "overlap": overlap,
        "max_buffer": max_buffer,
        "fixed_delay": fixed_delay,
        "max_concurrent": max_concurrent,
    }
    result = verdict(**given_value)
    wanted = {
        "overlap": overlap
        in ("skip", "buffer_one", "buffer_all", "cancel_other", "terminate_other", "allow_all"),
        "max_buffer": type(max_buffer) is int and 1 <= max_buffer <= 100_000,
        "fixed_delay": type(fixed_delay) is bool,
        "max_concurrent": type(max_concurrent) is int and 1 <= max_concurrent <= 1_000,
    }
    refused = {field for field, _ in result.errors}
    assert refused == {field for field, ok in wanted.items() if not ok}
    for field, ok in wanted.items():
        if ok:
            assert result.values[field] == given_value[field]
        else:
            assert field not in result.values


def test_an_overlap_refusal_names_the_policies():
    assert verdict(overlap="allow_any").errors == (
        (
            "overlap",
            "'allow_any' is not one of skip, buffer_one, buffer_all, cancel_other, "
            "terminate_other, allow_all.",
        ),
    )
    assert verdict(max_concurrent=0).errors == (
        ("max_concurrent", "0 is out of range; expected 1 to 1000."),
    )
    assert verdict(max_buffer=0).errors == (
        ("max_buffer", "0 is out of range; expected 1 to 100000."),
    )
