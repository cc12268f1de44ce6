"""Stored calendars: the API creates and replaces them with field-named errors and writes
nothing on a bad one; references keep their targets (PROTECT) and cycles are refused; the
admin edits them with the same rules and shows the next year's excluded days."""

from __future__ import annotations

from datetime import datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db.models import ProtectedError
from django.urls import reverse

from schedapp import api, calendars
from schedapp.models import Calendar, CalendarReference

pytestmark = [pytest.mark.django_db]

WEEKEND = {"weekdays": ["sat", "sun"]}
GERMANY = {"union": [{"holidays": {"country": "DE", "subdivision": "BY"}}, {"calendar": "weekend"}]}


def _errors(call) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        call()
    return caught.value.message_dict


def test_save_creates_then_replaces_and_records_references() -> None:
    weekend = api.save_calendar("weekend", WEEKEND, description="Saturdays and Sundays")
    germany = api.save_calendar("de-by", GERMANY)
    assert Calendar.objects.get(name="de-by").definition == GERMANY
    assert list(germany.references.all()) == [weekend]
    assert list(weekend.referenced_by.all()) == [germany]
    again = api.save_calendar("de-by", {"holidays": {"country": "DE"}})
    assert again.pk == germany.pk and again.definition == {"holidays": {"country": "DE"}}
    assert not CalendarReference.objects.filter(calendar=germany).exists()


@pytest.mark.parametrize(
    ("name", "definition", "field"),
    [
        ("x", {"holidays": {"country": "XX"}}, "definition.holidays.country"),
        ("x", {"union": [WEEKEND, {"dates": ["2026-13-01"]}]}, "definition.union[1].dates[0]"),
        ("x", {"calendar": "nowhere"}, "definition.calendar"),
        ("x", "weekends", "definition"),
        ("", WEEKEND, "name"),
        ("x" * 201, WEEKEND, "name"),
        ("x", {"weekdays": list(calendars.WEEKDAY_NAMES)}, "definition"),
    ],
)
def test_a_bad_calendar_names_its_field_and_writes_nothing(name, definition, field) -> None:
    errors = _errors(lambda: api.save_calendar(name, definition))
    assert field in errors, errors
    assert not Calendar.objects.exists()


def test_a_cycle_of_references_is_refused() -> None:
    api.save_calendar("a", WEEKEND)
    api.save_calendar("b", {"union": [{"calendar": "a"}, {"dates": ["2026-12-24"]}]})
    errors = _errors(lambda: api.save_calendar("a", {"calendar": "b"}))
    assert "cycle" in errors["definition.calendar.union[0].calendar"][0]
    assert Calendar.objects.get(name="a").definition == WEEKEND  # unchanged
    errors = _errors(lambda: api.save_calendar("c", {"calendar": "c"}))
    assert "cycle" in errors["definition.calendar"][0]


def test_a_named_calendar_cannot_be_deleted() -> None:
    weekend = api.save_calendar("weekend", WEEKEND)
    api.save_calendar("de-by", GERMANY)
    with pytest.raises(ProtectedError):
        weekend.delete()
    Calendar.objects.get(name="de-by").delete()
    weekend.delete()  # no longer named


def test_admin_adds_edits_and_shows_the_excluded_days(admin_client) -> None:
    api.save_calendar("weekend", WEEKEND)
    add = reverse("admin:schedapp_calendar_add")
    response = admin_client.post(
        add, {"name": "de-by", "description": "", "definition": '{"holidays": {"country": "ZZ"}}'}
    )
    assert response.status_code == 200
    assert "definition.holidays.country" in response.content.decode()
    assert not Calendar.objects.filter(name="de-by").exists()

    response = admin_client.post(
        add, {"name": "de-by", "description": "Bavaria", "definition": _json(GERMANY)}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    germany = Calendar.objects.get(name="de-by")
    assert [c.name for c in germany.references.all()] == ["weekend"]

    page = admin_client.get(reverse("admin:schedapp_calendar_change", args=[germany.pk]))
    text = page.content.decode()
    assert "whole days excluded" in text
    # 52 weekends and Bavaria's weekday holidays: more than 104 whole days in a year
    count = int(text.split(" whole days excluded")[0].rsplit(">", 1)[-1])
    assert 104 < count < 125

    # the weekend calendar is named by de-by: it keeps its name
    weekend = Calendar.objects.get(name="weekend")
    response = admin_client.post(
        reverse("admin:schedapp_calendar_change", args=[weekend.pk]),
        {"name": "week-end", "description": "", "definition": _json(WEEKEND)},
    )
    assert response.status_code == 200
    assert "keeps its name" in response.content.decode()
    assert Calendar.objects.filter(name="weekend").exists()


def _json(value: object) -> str:
    import json

    return json.dumps(value)


def test_preview_lists_runs_with_offsets_and_what_moved_them() -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    api.save_calendar("weekend", WEEKEND)
    api.save_calendar("de-by", GERMANY)
    berlin = ZoneInfo("Europe/Berlin")
    runs = api.preview_calendar(
        "de-by",
        cron="0 17 L * *",
        timezone="Europe/Berlin",
        roll="previous_business_day",
        count=3,
        after=datetime(2026, 12, 1, tzinfo=berlin),
    )
    # 31 Dec 2026 is a Thursday (a working day in Bavaria); January 2027 ends on a Sunday
    # (Friday the 29th); February 2027 on a Sunday (Friday the 26th)
    assert [(r["at"].date().isoformat(), r["utc_offset"], r["roll"]) for r in runs] == [
        ("2026-12-31", "+0100", None),
        ("2027-01-29", "+0100", "previous_business_day"),
        ("2027-02-26", "+0100", "previous_business_day"),
    ]
    assert runs[1]["occurrence"].date().isoformat() == "2027-01-31"
    skipping = api.preview_calendar(
        "weekend", cron="0 9 * * *", count=1, after=datetime(2026, 12, 4, 10, tzinfo=berlin)
    )
    assert skipping[0]["at"].date().isoformat() == "2026-12-07"
    assert [(s["count"], s["reason"]) for s in skipping[0]["skipped"]] == [(2, "excluded")]


def test_preview_names_each_bad_field() -> None:
    api.save_calendar("weekend", WEEKEND)
    errors = _errors(
        lambda: api.preview_calendar(
            "nowhere", cron="61 * * * *", timezone="Mars/Olympus", mode="x", roll="y", count=0
        )
    )
    assert set(errors) == {"calendar", "cron", "timezone", "mode", "roll", "count"}
    errors = _errors(lambda: api.preview_calendar("weekend"))
    assert set(errors) == {"cron"}


# --- iCalendar files ---------------------------------------------------------------------------

FIXTURE_ICS = Path(__file__).parent.parent / "data" / "closures.ics"


def test_import_saves_an_ics_file_as_a_calendar() -> None:
    saved = api.import_calendar("closures", FIXTURE_ICS, description="from a file")
    stored = Calendar.objects.get(name="closures")
    assert stored.pk == saved.pk and stored.description == "from a file"
    assert stored.definition == {"ical": {"text": FIXTURE_ICS.read_bytes().decode()}}  # as is
    rule = calendars.parse_calendar("closures", stored.definition).rule
    assert calendars.excludes(rule, datetime(2026, 12, 25, 12, 0))
    again = api.import_calendar("closures", FIXTURE_ICS, timezone="America/New_York")
    assert again.pk == saved.pk
    assert Calendar.objects.get(pk=saved.pk).definition["ical"]["timezone"] == "America/New_York"


def test_a_bad_ics_file_is_refused_on_a_named_field_and_nothing_is_written(tmp_path) -> None:
    broken = tmp_path / "broken.ics"
    broken.write_text("BEGIN:VCALENDAR\r\nthis is not a content line\r\n")
    latin = tmp_path / "latin.ics"
    latin.write_bytes("BEGIN:VCALENDAR\r\nSUMMARY:Fête\r\nEND:VCALENDAR\r\n".encode("latin-1"))
    hourly = tmp_path / "hourly.ics"
    hourly.write_text(
        FIXTURE_ICS.read_text().replace("FREQ=WEEKLY;BYDAY=MO;COUNT=5", "FREQ=HOURLY")
    )
    assert "definition.ical.text" in _errors(lambda: api.import_calendar("c", broken))
    assert "definition.ical.text" in _errors(lambda: api.import_calendar("c", hourly))
    assert "file" in _errors(lambda: api.import_calendar("c", latin))
    assert "file" in _errors(lambda: api.import_calendar("c", tmp_path / "missing.ics"))
    zone = _errors(lambda: api.import_calendar("c", FIXTURE_ICS, timezone="Nowhere/Else"))
    assert "definition.ical.timezone" in zone
    assert not Calendar.objects.exists()


def test_the_command_imports_and_reports_a_bad_file(tmp_path) -> None:
    out = StringIO()
    call_command("schedapp_calendar", "import", "closures", str(FIXTURE_ICS), stdout=out)
    assert "saved calendar 'closures'" in out.getvalue()
    assert Calendar.objects.get(name="closures").definition["ical"]["text"].startswith(
        "BEGIN:VCALENDAR"
    )
    broken = tmp_path / "broken.ics"
    broken.write_text("nonsense")
    with pytest.raises(CommandError, match=r"definition\.ical\.text"):
        call_command("schedapp_calendar", "import", "other", str(broken))
    assert not Calendar.objects.filter(name="other").exists()
