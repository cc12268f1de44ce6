"""The admin's plain words say when a cron needs both day fields (Celery's rule)."""

from __future__ import annotations

from schedapp.display import describe_schedule


def test_celerys_and_is_said_in_plain_words_when_both_day_fields_are_restricted():
    text = describe_schedule(None, "0 9 1-7 * sun", None, "UTC", day_or=False)
    assert text.endswith("only on days matching both the day of month and the day of week")
    assert "matching both" not in describe_schedule(None, "0 9 1-7 * sun", None, "UTC")
    assert "matching both" not in describe_schedule(None, "0 9 * * sun", None, "UTC", day_or=False)


def test_solar_schedules_are_described():
    text = describe_schedule(None, "", None, "UTC", solar_event="sunset", latitude=1.5, longitude=2)
    assert text == "At sunset at latitude 1.5, longitude 2"
