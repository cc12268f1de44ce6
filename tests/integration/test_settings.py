"""The ``SCHEDAPP_*`` settings do what docs/settings.md says: the defaults new jobs get, the
beat's batch, sleeps, idle-transaction guard and dispatch log, and the housekeeping jobs.

The beat is the real ``LeaseScheduler`` ticking in this process against PostgreSQL and the
tests' Redis; settings are Django's (``override_settings``), read when the beat is set up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from schedapp import api, beat, db, declared
from schedapp.celeryapp import celery_app
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "project.tasks.record"


@pytest.fixture
def start_beat(broker_url: str) -> Iterator[Callable[..., beat.LeaseScheduler]]:
    """Beats in this process, set up (settings read, LISTEN opened) under the settings given;
    a beat reads its settings when it starts. Idle ticks sleep 0.1 s unless told otherwise."""
    started: list[beat.LeaseScheduler] = []

    def start(**settings: Any) -> beat.LeaseScheduler:
        s = beat.LeaseScheduler(celery_app(), lazy=True)
        started.append(s)
        with override_settings(**{"SCHEDAPP_MAX_SLEEP": 0.1, **settings}):
            s.setup_schedule()
        return s

    try:
        yield start
    finally:
        for s in started:
            s.close()


def due(count: int) -> list[Job]:
    past = db_now() - timedelta(seconds=5)
    return [api.schedule(TASK, run_at=past, name=f"due-{i}") for i in range(count)]


# --- defaults of new jobs -------------------------------------------------------------------


@override_settings(
    SCHEDAPP_DEFAULT_LEASE_SECONDS=120,
    SCHEDAPP_DEFAULT_MAX_RETRIES=7,
    SCHEDAPP_DEFAULT_RETRY_BACKOFF=5,  # durations accept seconds ...
    SCHEDAPP_DEFAULT_RETRY_BACKOFF_MAX=timedelta(minutes=10),  # ... or a timedelta
    SCHEDAPP_DEFAULT_MISFIRE_POLICY="skip",
    SCHEDAPP_DEFAULT_MISFIRE_GRACE=30.5,
    SCHEDAPP_DEFAULT_MISFIRE_MAX_CATCHUP=12,
    SCHEDAPP_DEFAULT_CATCHUP_WINDOW=90,  # optional, and seconds too
)
def test_a_new_job_takes_the_default_settings_and_its_own_arguments_over_them():
    job = api.schedule(TASK, interval=60, name="defaults")
    assert (job.lease_seconds, job.max_retries) == (120, 7)
    assert job.retry_backoff == timedelta(seconds=5)
    assert job.retry_backoff_max == timedelta(minutes=10)
    assert job.misfire_policy == "skip" and job.misfire_grace == timedelta(seconds=30.5)
    assert job.misfire_max_catchup == 12
    assert job.catchup_window == timedelta(seconds=90)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.lease_seconds, stored.retry_backoff) == (120, timedelta(seconds=5))

    own = api.schedule(TASK, interval=60, name="own", max_retries=1, misfire_policy="run_all")
    assert (own.max_retries, own.misfire_policy, own.lease_seconds) == (1, "run_all", 120)
    assert api.schedule(TASK, interval=60, name="x", catchup_window=None).catchup_window is None


# --- the beat -------------------------------------------------------------------------------


def test_a_beat_claims_at_most_batch_size_jobs_a_tick_and_goes_straight_on(start_beat):
    scheduler = start_beat(SCHEDAPP_BATCH_SIZE=3)
    due(7)
    assert scheduler.tick() == 0  # a full batch: more may be due, no sleep
    assert JobRun.objects.count() == 3
    assert scheduler.tick() == 0
    assert JobRun.objects.count() == 6
    scheduler.tick()
    assert JobRun.objects.count() == 7


def test_an_idle_beat_sleeps_max_sleep_on_its_listener(start_beat):
    scheduler = start_beat(SCHEDAPP_MAX_SLEEP=0.4)
    assert scheduler._listener is not None
    started = time.monotonic()
    assert scheduler.tick() == 0  # it slept on the notification socket itself
    slept = time.monotonic() - started
    assert 0.35 <= slept < 1.5, slept


def without_listener(scheduler: beat.LeaseScheduler) -> beat.LeaseScheduler:
    """As on a database without LISTEN/NOTIFY (SQLite), or while the listener is reopened."""
    scheduler._listener.close()
    scheduler._listener, scheduler._listener_tried = None, time.monotonic()
    return scheduler


def test_without_listen_an_idle_beat_looks_every_second_or_max_sleep_if_shorter(start_beat):
    assert without_listener(start_beat(SCHEDAPP_MAX_SLEEP=5.0)).tick() == 1.0
    assert without_listener(start_beat(SCHEDAPP_MAX_SLEEP=0.25)).tick() == 0.25


def test_a_beat_waits_min_sleep_when_the_due_rows_are_locked_by_another_beat(start_beat):
    scheduler = without_listener(start_beat(SCHEDAPP_MIN_SLEEP=0.2, SCHEDAPP_MAX_SLEEP=5.0))
    due(1)
    locker = threading.Event()
    release = threading.Event()

    def hold() -> None:  # another beat, mid-claim, on a connection of its own
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT id FROM schedapp_job FOR UPDATE")
            locker.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locker.wait(10)
        assert scheduler.tick() == 0.2
        assert not JobRun.objects.exists()
    finally:
        release.set()
        thread.join()


def later(seconds: float, name: str) -> Job:
    return api.schedule(TASK, run_at=db_now() + timedelta(seconds=seconds), name=name)


def test_at_a_steady_stream_a_beats_claims_are_min_sleep_apart(start_beat, monkeypatch):
    # Given jobs coming due faster than MIN_SLEEP: one due now, the next in 50 ms
    scheduler = without_listener(start_beat(SCHEDAPP_MIN_SLEEP=0.5, SCHEDAPP_MAX_SLEEP=5.0))
    due(1)
    later(0.05, "next")
    # (the claim reads when to wake in its own transaction: no read after it)
    monkeypatch.setattr(beat, "seconds_until_due", lambda: pytest.fail("a read of its own"))
    started = time.monotonic()
    delay = scheduler.tick()
    # Then the beat waits until MIN_SLEEP after the claim began, not until the next job is due:
    # the claim after it takes what came due meanwhile, in one transaction
    assert 0.5 - (time.monotonic() - started) <= delay <= 0.5
    assert JobRun.objects.count() == 1
    time.sleep(delay)
    scheduler.tick()
    assert JobRun.objects.count() == 2


def test_a_job_due_after_a_quiet_spell_is_claimed_at_its_instant(start_beat):
    scheduler = without_listener(start_beat(SCHEDAPP_MIN_SLEEP=0.5, SCHEDAPP_MAX_SLEEP=5.0))
    due(1)
    started = time.monotonic()
    later(0.8, "next")
    # the floor counts from the last claim: a job due later than it waits no longer, and
    # no less (less only by the time this took, which a loaded machine may stretch)
    delay = scheduler.tick()
    assert 0.8 - (time.monotonic() - started) - 0.01 <= delay <= 0.8


def test_notifications_do_not_cut_short_a_sleep_that_keeps_claims_apart(start_beat):
    scheduler = start_beat(SCHEDAPP_MIN_SLEEP=0.5, SCHEDAPP_MAX_SLEEP=5.0)
    assert scheduler._listener is not None
    due(1)
    later(0.05, "next")
    api.schedule(TASK, run_at=db_now(), name="notified")  # notifies the beats
    started = time.monotonic()
    # the floor is left to Celery's loop to sleep (a plain sleep), not slept on the listener,
    # which the notification would have ended at once
    delay = scheduler.tick()
    assert 0.5 - (time.monotonic() - started) <= delay <= 0.5
    assert JobRun.objects.count() == 2
    time.sleep(delay)
    scheduler.tick()  # then takes the next
    assert JobRun.objects.count() == 3


def test_a_beats_transactions_are_ended_by_postgresql_when_idle_that_long_and_only_they():
    def idle_limit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            return cursor.fetchone()[0]

    with override_settings(SCHEDAPP_BEAT_TRANSACTION_TIMEOUT=7.5):
        with db.beat_transaction():  # a claim's, a release's, a quarantine's, the sync's
            assert idle_limit() == "7500ms"
        # nothing stays on the session (behind a transaction pooler, another client's)
        assert idle_limit() == "0"
        connection.close()  # a reconnect (after an outage) gets the limit again
        with db.beat_transaction():
            assert idle_limit() == "7500ms"
        with db.claim_transaction():  # a claim's: set by its probe, the same statement
            assert idle_limit() == "7500ms"
        assert idle_limit() == "0"


def dispatch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery.beat"]


@pytest.mark.parametrize(
    ("mode", "burst", "expected"),
    [
        ("each", 100, [f"Scheduler: Sending due task due-{i} ({TASK})" for i in range(3)]),
        (
            "each",
            2,
            [
                f"Scheduler: Sending due task due-0 ({TASK})",
                f"Scheduler: Sending due task due-1 ({TASK})",
                "Scheduler: Sent 3 due tasks in one batch (1 not listed one by one)",
            ],
        ),
        ("batch", 100, ["Scheduler: Sent 3 due tasks in one batch (3 not listed one by one)"]),
        ("off", 100, []),
    ],
)
def test_dispatch_log_modes(start_beat, caplog, mode, burst, expected):
    scheduler = start_beat(SCHEDAPP_DISPATCH_LOG=mode, SCHEDAPP_DISPATCH_LOG_BURST=burst)
    due(3)
    with caplog.at_level(logging.INFO, logger="celery.beat"):
        scheduler.tick()
    assert JobRun.objects.count() == 3
    assert sorted(dispatch_lines(caplog)) == sorted(expected)


def test_a_retried_send_says_which_retry_it_is(start_beat, caplog):
    from schedapp import lease

    scheduler = start_beat()
    past = db_now() - timedelta(seconds=5)
    job = api.schedule(TASK, run_at=past, name="flaky", max_retries=3, retry_backoff=0)
    lines = []
    for _ in range(3):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="celery.beat"):
            scheduler.tick()
        lines += dispatch_lines(caplog)
        run = JobRun.objects.filter(job=job).latest("id")
        lease.admit_run(job.pk, run.token, "w1", f"a{run.token}")
        lease.complete_run(job.pk, run.token, lease.FAILED, error="boom")
        Job.objects.filter(pk=job.pk).update(next_run_at=past)  # due now, whatever the backoff
    assert lines == [
        f"Scheduler: Sending due task flaky ({TASK})",
        f"Scheduler: Sending due task flaky ({TASK}), retry 1/3",
        f"Scheduler: Sending due task flaky ({TASK}), retry 2/3",
    ]


# --- housekeeping ---------------------------------------------------------------------------


@override_settings(
    SCHEDAPP_HOUSEKEEPING=True,
    SCHEDAPP_HOUSEKEEPING_CRON="45 4 * * 0",
    SCHEDAPP_RUN_RETENTION=7 * 86400,  # seconds, as every duration may be given
    SCHEDAPP_RESULT_RETENTION=timedelta(hours=6),
)
def test_housekeeping_runs_on_its_cron_in_utc_with_the_retentions_given():
    declared.sync_declared_jobs()
    prune = Job.objects.get(name="schedapp-prune-runs")
    results = Job.objects.get(name="schedapp-cleanup-results")
    for job in (prune, results):
        assert (job.cron, job.timezone) == ("45 4 * * 0", "UTC")
        assert job.next_run_at.weekday() == 6
        assert (job.next_run_at.hour, job.next_run_at.minute) == (4, 45)
    assert prune.kwargs == {"older_than_seconds": 7 * 86400.0}
    assert results.kwargs == {"older_than_seconds": 6 * 3600.0}


@override_settings(SCHEDAPP_HOUSEKEEPING=True)
def test_housekeeping_off_declares_neither_job_and_pauses_those_declared_before():
    declared.sync_declared_jobs()
    assert Job.objects.filter(state=JobState.SCHEDULED).count() == 2
    with override_settings(SCHEDAPP_HOUSEKEEPING=False):
        assert declared.housekeeping_declarations() == {}
        declared.sync_declared_jobs()
    assert set(Job.objects.values_list("name", "state")) == {
        ("schedapp-prune-runs", JobState.PAUSED),
        ("schedapp-cleanup-results", JobState.PAUSED),
    }
