"""The beat in this process against real PostgreSQL: it never raises out of ``tick``, its
LISTEN connection is Django's, and a claim that ran long stamps its leases again."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from schedapp import api, beat, claims, policies
from schedapp.db import db_now
from schedapp.models import Job
from schedapp.store import get_store
from schedapp.validation import celery_app

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tick_that_fails_unexpectedly_backs_off_instead_of_ending_the_beat(monkeypatch):
    from prometheus_client import REGISTRY

    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug nobody foresaw")

    def errors() -> float:
        labels = {"kind": "unexpected"}
        return REGISTRY.get_sample_value("schedapp_beat_errors_total", labels) or 0.0

    monkeypatch.setattr(beat, "claim_due_jobs", broken)
    before = errors()
    started = time.monotonic()
    try:
        for _ in range(3):
            scheduler.tick()  # does not raise: Celery's beat loop would end on an exception
    finally:
        scheduler.close()
    # each failure was counted, and the beat backed off (0.5 s, then 1 s, ...) between them
    assert errors() - before == 3
    assert time.monotonic() - started >= 1.5


def test_the_listen_connection_is_opened_with_djangos_options():
    options = connection.settings_dict["OPTIONS"]
    options["application_name"] = "schedapp-listen-test"
    listener = None
    try:
        listener = get_store().listen()
        assert listener is not None
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND query LIKE 'LISTEN%%'",
                ["schedapp-listen-test"],
            )
            assert cursor.fetchone()[0] == 1
    finally:
        options.pop("application_name")
        if listener is not None:
            listener.close()


def test_a_claim_slowed_past_its_leases_stamps_them_again_before_it_commits(monkeypatch):
    # Given late recurring jobs with one-second leases, and misfire planning slowed down as on
    # an overloaded host (or with a schedule that is expensive to plan)
    jobs = [
        api.schedule("project.tasks.record", cron="* * * * *", name=f"slow-{i}", lease_seconds=1)
        for i in range(3)
    ]
    away = db_now() - timedelta(hours=1)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(scheduled_for=away, next_run_at=away)
    plan = policies.plan_misfire

    def slow_plan(*args, **kwargs):
        time.sleep(0.6)
        return plan(*args, **kwargs)

    monkeypatch.setattr(policies, "plan_misfire", slow_plan)
    # When one claim takes them (1.8 s: longer than the leases it grants)
    result = claims.claim_due_jobs("beat-1", 10)
    # Then every lease is still valid once the claim has committed
    assert len(result.runs) == 3 and result.restamped
    now = db_now()
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert job.lease_expires_at > now, (job.lease_expires_at, now)


def test_a_beat_never_sleeps_longer_than_its_max_interval():
    """``celery beat --max-interval`` (``beat_max_loop_interval``): Celery's beat never
    sleeps longer between looks at the schedule. A job written without a notification (by
    SQL, another tool) is found within it. Before, a beat with nothing due slept its own 5 s
    ceiling (``SCHEDAPP_MAX_SLEEP``) whatever the max interval."""
    scheduler = beat.LeaseScheduler(celery_app(), max_interval=0.5, lazy=True)
    try:
        scheduler.tick()  # set up; nothing is due
        started = time.monotonic()
        scheduler.tick()  # sleeps (on its LISTEN connection) until something is due
        assert time.monotonic() - started < 1.0
    finally:
        scheduler.close()


def test_a_beat_backs_off_no_longer_than_its_max_interval(monkeypatch):
    """While the database is unreachable the beat backs off (0.5 s, 1 s, ... 30 s), never
    past its max interval."""
    scheduler = beat.LeaseScheduler(celery_app(), max_interval=0.7, lazy=True)

    def unreachable(*args: object, **kwargs: object) -> None:
        from django.db import OperationalError

        raise OperationalError("connection refused")

    monkeypatch.setattr(beat, "claim_due_jobs", unreachable)
    took = []
    try:
        scheduler.setup_schedule()
        for _ in range(3):
            started = time.monotonic()
            time.sleep(scheduler.tick())  # as Celery's beat loop sleeps what tick returns
            took.append(time.monotonic() - started)
    finally:
        scheduler.close()
    assert 0.45 < took[0] < 0.65, took  # 0.5 s, then 1 s and 2 s, each cut to the max interval
    assert all(0.65 < t < 0.9 for t in took[1:]), took
