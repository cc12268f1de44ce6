"""Calendars declared in code (SCHEDAPP_CALENDARS), synced when a beat starts: created and
updated idempotently, an invalid one reported and skipped (the beat goes on), one no longer
declared left in place; ``manage.py check`` names an invalid one (E022)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from schedapp import api, checks, declared
from schedapp.models import Calendar

pytestmark = [pytest.mark.django_db]

WEEKEND = {"weekdays": ["sat", "sun"]}
CLOSED = {"union": [{"calendar": "weekend"}, {"dates": ["2026-12-24"]}]}
ICS = (Path(__file__).parent.parent / "data" / "closures.ics").read_bytes().decode()


def stored() -> dict[str, tuple]:
    return {c.name: (c.definition, c.updated_at) for c in Calendar.objects.all()}


def test_sync_creates_in_reference_order_and_a_second_sync_writes_nothing() -> None:
    decls = {"closed": CLOSED, "weekend": WEEKEND, "closures": {"ical": ICS}}
    report = declared.sync_declared_calendars(decls)
    assert sorted(report.created) == ["closed", "closures", "weekend"]
    assert report.errors == {} and report.updated == []
    closed = Calendar.objects.get(name="closed")
    assert closed.definition == CLOSED
    assert closed.description == declared.DECLARED_CALENDAR_DESCRIPTION
    assert [c.name for c in closed.references.all()] == ["weekend"]
    before = stored()
    again = declared.sync_declared_calendars(decls)
    assert sorted(again.unchanged) == ["closed", "closures", "weekend"]
    assert again.created == again.updated == [] and stored() == before


def test_a_changed_declaration_replaces_an_edit_and_keeps_the_description() -> None:
    declared.sync_declared_calendars({"weekend": WEEKEND})
    api.save_calendar("weekend", {"weekdays": ["sun"]}, description="edited by hand")
    report = declared.sync_declared_calendars({"weekend": {"weekdays": ("sat", "sun")}})
    assert report.updated == ["weekend"]
    weekend = Calendar.objects.get(name="weekend")
    assert weekend.definition == WEEKEND and weekend.description == "edited by hand"


def test_an_invalid_declaration_is_reported_and_the_others_synced(caplog) -> None:
    decls = {
        "bad-country": {"union": [WEEKEND, {"holidays": {"country": "XX"}}]},
        "bad-ical": {"ical": "not a calendar"},
        "missing": {"calendar": "nowhere"},
        "weekend": WEEKEND,
        3: WEEKEND,
    }
    report = declared.sync_declared_calendars(decls)
    assert report.created == ["weekend"]
    assert set(report.errors) == {"bad-country", "bad-ical", "missing", "3"}
    assert report.errors["bad-country"][0].startswith("definition.union[1].holidays.country:")
    assert report.errors["bad-ical"][0].startswith("definition.ical.text:")
    assert report.errors["missing"][0].startswith("definition.calendar:")
    assert set(Calendar.objects.values_list("name", flat=True)) == {"weekend"}
    assert "declared calendar bad-ical is invalid" in caplog.text


def test_a_calendar_no_longer_declared_is_left_in_place() -> None:
    declared.sync_declared_calendars({"weekend": WEEKEND, "closed": CLOSED})
    report = declared.sync_declared_calendars({"weekend": WEEKEND})
    assert report.unchanged == ["weekend"]
    assert Calendar.objects.get(name="closed").definition == CLOSED


def test_the_beat_syncs_declared_calendars_and_a_bad_one_does_not_stop_it() -> None:
    from schedapp import beat
    from schedapp.celeryapp import celery_app

    decls = {"weekend": WEEKEND, "bad": {"weekdays": ["someday"]}}
    with override_settings(SCHEDAPP_CALENDARS=decls, SCHEDAPP_JOBS={}):
        scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
        scheduler._sync_declared_jobs()
    assert list(Calendar.objects.values_list("name", flat=True)) == ["weekend"]


def test_check_names_each_invalid_declared_calendar() -> None:
    decls = {
        "weekend": WEEKEND,
        "closed": CLOSED,  # a declared reference
        "stored": {"calendar": "kept-in-the-database"},  # not read here: the sync checks it
        "bad": {"union": [WEEKEND, {"time_range": {"start": "25:00", "end": "06:00"}}]},
        "everything": {"weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
        "loop": {"calendar": "loop"},
    }
    with override_settings(SCHEDAPP_CALENDARS=decls):
        found = checks.check_declared_calendars()
        with pytest.raises(SystemCheckError) as failed:
            call_command("check")
    assert {m.id for m in found} == {"schedapp.E022"}
    by_name = {m.obj: m.msg for m in found}
    assert set(by_name) == {"bad", "everything", "loop"}
    assert "definition.union[1].time_range.start" in by_name["bad"]
    assert "excludes every day" in by_name["everything"]
    assert "cycle" in by_name["loop"]
    assert "(schedapp.E022) Declared calendar 'bad'" in str(failed.value)


def test_settings_check_refuses_calendars_that_are_not_a_mapping() -> None:
    from schedapp.settings_checks import settings_problems

    with override_settings(SCHEDAPP_CALENDARS=["weekend"]):
        problems = settings_problems()
        assert declared.declared_calendars() == {}
    assert any(p.startswith("SCHEDAPP_CALENDARS must be a mapping") for p in problems)
