"""``schedapp_import --update`` writes each existing job in a short transaction of its own:
one transaction over the whole import held running jobs' rows, and their lease renewals skip
locked rows (DESIGN.md note 23)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schedapp import importer
from schedapp.models import Job
from tests.rowlocks import probing_updates

pytestmark = [pytest.mark.django_db]


@pytest.mark.django_db(transaction=True)
def test_import_update_holds_no_job_row_while_it_writes_the_next(monkeypatch):
    entries = {n: {"task": "project.tasks.noop", "schedule": 60} for n in ("a", "b", "c")}
    importer.import_candidates(importer.from_beat_schedule(entries))
    changed = {n: {**e, "schedule": 120} for n, e in entries.items()}
    with probing_updates(monkeypatch, "a") as seen:
        report = importer.import_candidates(importer.from_beat_schedule(changed), update=True)
    assert sorted(report.updated) == ["a", "b", "c"]
    assert seen == [True, True]
    assert {j.interval for j in Job.objects.all()} == {timedelta(seconds=120)}


def test_import_update_dry_run_writes_nothing():
    entries = {"a": {"task": "project.tasks.noop", "schedule": 60}}
    importer.import_candidates(importer.from_beat_schedule(entries))
    changed = {"a": {"task": "project.tasks.noop", "schedule": 120}}
    report = importer.import_candidates(
        importer.from_beat_schedule(changed), update=True, dry_run=True
    )
    assert report.updated == ["a"]
    assert Job.objects.get(name="a").interval == timedelta(seconds=60)
