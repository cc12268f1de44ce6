"""Declared jobs across releases: the sync holds no job row while it writes another, and the
newest set of declarations wins whatever order beats start in (DESIGN.md notes 23 and 27)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from schedapp import api, declared, importer
from schedapp.models import Declaration, Job, JobSource, JobState
from tests.rowlocks import other_connection, probing_updates

pytestmark = [pytest.mark.django_db]


def spec(version: int, task: str = "project.tasks.noop") -> dict[str, Any]:
    return {"task": task, "cron": "0 3 1 1 *", "kwargs": {"v": version}}


def sync(jobs: dict[str, Any], release: str = "") -> declared.SyncReport:
    with override_settings(SCHEDAPP_JOBS=jobs, SCHEDAPP_RELEASE=release):
        return declared.sync_declared_jobs()


def states() -> dict[str, tuple[str, Any]]:
    return {j.name: (j.state, j.kwargs) for j in Job.objects.order_by("name")}


@pytest.mark.django_db(transaction=True)
def test_the_sync_holds_a_job_row_only_for_its_own_short_batch(monkeypatch):
    # Given 60 declared jobs, "a00" first (three times the names one transaction writes)
    names = [f"a{i:02}" for i in range(60)]
    sync({n: spec(1) for n in names})
    # When a deploy changes them all
    with probing_updates(monkeypatch, "a00") as seen:
        report = sync({n: spec(2) for n in names})
    # Then a00's row was free for a renewal or a door to lock while all but the jobs of its
    # own batch were written
    assert sorted(report.updated) == names
    assert len(seen) == 59 and seen[-1], seen
    assert seen.count(False) < declared.WRITE_BATCH, seen
    # And every job's declaration names the set that wrote it, however the batches were cut
    stamped = Declaration.objects.filter(name__in=names, declared=True)
    assert set(stamped.values_list("declaration_set__release", flat=True)) == {""}
    assert stamped.exclude(declaration_set=None).count() == len(names)


def test_an_older_release_never_reverts_or_pauses_what_a_newer_one_declared():
    sync({"A": spec(1), "C": spec(1)}, release="9")
    sync({"A": spec(2), "B": spec(2)}, release="10")
    newest = states()
    # A beat of release 9 starting afterwards (even with declarations never seen before)
    report = sync({"A": spec(1), "C": spec(1), "D": spec(1)}, release="9")
    assert states() == {**newest, "D": ("scheduled", {"v": 1})}
    assert sorted(report.superseded) == ["A", "B", "C"]
    assert (report.updated, report.paused) == ({}, [])
    # A later release wins again
    report = sync({"A": spec(3), "B": spec(3)}, release="11")
    assert states()["A"] == ("scheduled", {"v": 3})
    assert report.paused == ["D"]


def test_without_a_release_the_set_first_seen_later_is_the_newer():
    sync({"A": spec(1), "C": spec(1)})
    sync({"A": spec(2), "B": spec(2)})
    newest = states()
    sync({"A": spec(1), "C": spec(1)})  # an old beat restarting (or a rollback: see the docs)
    assert states() == newest


def test_a_set_with_a_release_is_newer_than_one_without():
    sync({"A": spec(1)}, release="1")
    report = sync({"A": spec(2)})
    assert report.superseded == ["A"] and states()["A"] == ("scheduled", {"v": 1})


def test_a_job_paused_by_a_withdrawal_comes_back_but_a_persons_pause_stays():
    sync({"gone": spec(1), "held": spec(1), "resumed": spec(1), "toggled": spec(1)}, "1")
    api.pause(Job.objects.get(name="held"))  # a person's pause, before the withdrawal
    report = sync({}, "2")
    assert sorted(report.paused) == ["gone", "resumed", "toggled"]
    # A person resumes two of them; one of those they pause again
    api.resume(Job.objects.get(name="resumed"))
    api.resume(Job.objects.get(name="toggled"))
    api.pause(Job.objects.get(name="toggled"))
    # Release 2's beat restarting does not pause again what a person resumed
    assert sync({}, "2").paused == []
    assert Job.objects.get(name="resumed").state == JobState.SCHEDULED
    # Release 3 declares them all again: only the job the sync paused comes back
    report = sync({n: spec(3) for n in ("gone", "held", "resumed", "toggled")}, "3")
    assert report.resumed == ["gone"]
    assert sorted(report.waiting) == ["held", "toggled"]
    assert {n: s for n, (s, _) in states().items()} == {
        "gone": "scheduled",
        "held": "paused",
        "resumed": "scheduled",
        "toggled": "paused",
    }


def test_a_job_of_another_source_is_neither_synced_nor_stamped():
    api.schedule("project.tasks.noop", interval=60, name="mine")
    report = sync({"mine": spec(1)})
    assert "mine" in report.conflicts
    assert Job.objects.get(name="mine").source == JobSource.API
    assert not Declaration.objects.filter(name="mine", declared=True).exists()


def test_a_beat_of_the_same_release_starting_again_writes_nothing():
    jobs = {f"j{i}": spec(1) for i in range(5)}
    sync(jobs, "1")
    before = {j.name: j.updated_at for j in Job.objects.all()}
    report = sync(jobs, "1")
    assert sorted(report.unchanged) == sorted(jobs)
    assert {j.name: j.updated_at for j in Job.objects.all()} == before


def test_a_new_release_with_unchanged_declarations_only_stamps_them():
    jobs = {f"j{i}": spec(1) for i in range(5)}
    sync(jobs, "1")
    before = {j.name: j.updated_at for j in Job.objects.all()}
    report = sync({**jobs, "new": spec(1)}, "2")
    assert report.created == ["new"] and sorted(report.unchanged) == sorted(jobs)
    assert {j.name: j.updated_at for j in Job.objects.exclude(name="new")} == before
    assert set(Declaration.objects.values_list("declaration_set__release", flat=True)) == {"2"}


@pytest.mark.parametrize(
    "older, newer",
    [
        ("9", "10"),
        ("41", "100"),
        ("2026.12.2", "2026.12.10"),
        ("v2", "v10"),
        ("2026-12-02T09:00", "2026-12-02T16:30"),
        ("1.0", "1.0.1"),
    ],
)
def test_releases_compare_part_by_part_with_numbers_as_numbers(older, newer):
    assert declared.release_key(older) < declared.release_key(newer)


def test_a_relative_beat_schedule_entrys_fingerprint_does_not_move_with_the_clock():
    from celery.schedules import schedule

    entry = {"task": "project.tasks.noop", "schedule": schedule(timedelta(hours=1), relative=True)}
    first, later = (
        {
            "e": {
                "task": "project.tasks.noop",
                **importer.map_beat_entry("e", entry, "UTC", now).spec,
                "_keep_phase": True,
            }
        }
        for now in (
            datetime(2026, 1, 1, 10, 5, tzinfo=UTC),
            datetime(2026, 1, 1, 11, 40, tzinfo=UTC),
        )
    )
    assert first != later
    assert declared.fingerprint(first) == declared.fingerprint(later)


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_row_stays_busy_is_deferred_to_the_next_sync(monkeypatch):
    sync({"a": spec(1), "b": spec(1)}, "1")
    monkeypatch.setattr(declared, "BUSY_PASSES", 2)
    monkeypatch.setattr(declared, "BUSY_PAUSE", 0.01)
    # Given another transaction holding a's row for the whole sync (a slow door, a person)
    with other_connection() as other, other.transaction():
        other.execute("SELECT id FROM schedapp_job WHERE name = 'a' FOR UPDATE")
        report = sync({"a": spec(2), "b": spec(2)}, "2")
    # Then the sync went on without waiting, and left a's change for the next one
    assert (report.deferred, sorted(report.updated)) == (["a"], ["b"])
    assert states()["a"] == ("scheduled", {"v": 1})
    report = sync({"a": spec(2), "b": spec(2)}, "2")
    assert (report.deferred, sorted(report.updated)) == ([], ["a"])
    assert states()["a"] == ("scheduled", {"v": 2})


@pytest.mark.django_db(transaction=True)
def test_two_releases_syncing_at_once_end_with_the_newest_and_never_deadlock():
    names = [f"j{i:03}" for i in range(150)]
    sync({n: spec(0) for n in names}, "0")
    errors: list[BaseException] = []

    def beat(version: int, order: list[str]) -> None:
        try:
            # (not override_settings: it is process-wide, and two threads would mix it up)
            declared.sync_declared_jobs({n: spec(version) for n in order}, release=str(version))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=beat, args=(1, names)),
        threading.Thread(target=beat, args=(2, names[::-1])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert {kwargs["v"] for _, kwargs in states().values()} == {2}
