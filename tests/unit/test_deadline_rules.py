"""The deadline options' rules (``schedapp.option_rules``): each optional, refused on its own
field with a message that says what is wrong, accepted values stored normalised."""

from __future__ import annotations

import math
from datetime import time, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp.policies import MAX_DELAY
from tests import examples
from tests.unit.test_option_rules import verdict

durations = st.one_of(
    st.none(),
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=400)),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=5),
)


def as_duration(value: object) -> timedelta | None:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    try:
        return timedelta(seconds=value)
    except OverflowError:
        return None


@settings(max_examples=examples(200), deadline=None)
@given(value=durations, field=st.sampled_from(["start_deadline", "max_runtime"]))
def test_property_a_deadline_is_kept_exactly_when_none_or_a_positive_duration(value, field):
    result = verdict(**{field: value})
    duration = as_duration(value)
    if value is None or (duration is not None and timedelta(0) < duration <= MAX_DELAY):
        assert result.errors == ()
        assert result.values[field] == duration
    else:
        assert [f for f, _ in result.errors] == [field]
        assert field not in result.values


def test_each_refusal_names_its_field_and_says_why():
    said = {
        "zero": verdict(start_deadline=0).errors,
        "not a number": verdict(max_runtime="ten").errors,
        "skip without deadline": verdict(skip_late=True).errors,
        "revoke without runtime": verdict(revoke_overrun=True).errors,
        "not a bool": verdict(skip_late="yes", start_deadline=10).errors,
        "bad time": verdict(finish_by="25:00").errors,
        "offset": verdict(finish_by="09:00+02:00").errors,
        "count zero": verdict(alert_after_failures=0).errors,
        "count bool": verdict(alert_after_failures=True).errors,
    }
    assert said == {
        "zero": (("start_deadline", "must be more than 0 (None: no deadline)."),),
        "not a number": (("max_runtime", "must be a duration (timedelta or seconds), or None."),),
        "skip without deadline": (
            ("skip_late", "needs a start_deadline: late is counted from it."),
        ),
        "revoke without runtime": (
            ("revoke_overrun", "needs a max_runtime: overrunning is counted from it."),
        ),
        "not a bool": (("skip_late", "must be True or False, got str."),),
        "bad time": (("finish_by", "'25:00' is not a time such as '09:00'."),),
        "offset": (("finish_by", "must be a wall-clock time, in the job's zone: no offset."),),
        "count zero": (("alert_after_failures", "0 is out of range; expected 1 to 10000."),),
        "count bool": (("alert_after_failures", "must be a whole number, got bool."),),
    }


def test_accepted_values_are_stored_normalised():
    result = verdict(
        start_deadline=30,
        skip_late=True,
        max_runtime=timedelta(minutes=5),
        revoke_overrun=True,
        finish_by="09:00",
        alert_after_failures=3,
    )
    assert result.errors == ()
    assert {k: result.values[k] for k in ("start_deadline", "max_runtime", "finish_by")} == {
        "start_deadline": timedelta(seconds=30),
        "max_runtime": timedelta(minutes=5),
        "finish_by": time(9, 0),
    }


def test_the_settings_check_names_a_bad_deadline_default():
    from django.test import override_settings

    from schedapp.settings_checks import settings_problems

    cases = {
        "unknown": ({"start_deadlin": 10}, "SCHEDAPP_DEADLINES: unknown deadline(s)"),
        "bad value": (
            {"start_deadline": -1},
            "SCHEDAPP_DEADLINES['start_deadline']: must be more than 0",
        ),
        "not a mapping": ([1], "SCHEDAPP_DEADLINES must be a mapping"),
        "skip alone": ({"skip_late": True}, "SCHEDAPP_DEADLINES['skip_late']: needs a"),
    }
    for name, (value, said) in cases.items():
        with override_settings(SCHEDAPP_DEADLINES=value):
            problems = settings_problems()
        assert any(p.startswith(said) for p in problems), (name, problems)
    with override_settings(SCHEDAPP_DEADLINES={"start_deadline": 60, "finish_by": "09:00"}):
        assert settings_problems() == []
