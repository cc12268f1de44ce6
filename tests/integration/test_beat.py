"""The beat in this process against real PostgreSQL: it never raises out of ``tick``, its
LISTEN connection is Django's, and a claim that ran long stamps its leases again."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection

from schedapp import api, beat, dispatch, lease, policies
from schedapp.celeryapp import celery_app
from schedapp.db import db_now
from schedapp.models import Job, JobRun
from schedapp.store import get_store
from schedapp.testing.processes import wait_until
from tests.integration import test_dispatch_amqp

pytestmark = pytest.mark.django_db(transaction=True)
rabbit = test_dispatch_amqp.rabbit  # queues of the test's own on the machine's RabbitMQ


def backfilling(occurrences: int) -> Job:
    """A job every minute with nothing of its own due, and a backfill of its last
    ``occurrences`` running, throttled loosely enough to send them all in one tick."""
    minute = timedelta(minutes=1)
    anchor = db_now().replace(second=0, microsecond=0) - timedelta(days=1)
    job = api.schedule(
        "project.tasks.record",
        interval=minute,
        interval_anchor=anchor,
        name="backfilled",
        max_concurrent=10,
    )
    end = db_now().replace(second=0, microsecond=0) - minute
    api.backfill(job, end - (occurrences - 1) * minute, end, max_per_second=100)
    return job


@contextmanager
def stopped_after_sending(count: int) -> Iterator[list[str]]:
    """The beat stopped as it publishes its message number ``count + 1`` (Celery's
    SIGTERM/SIGINT handler raises SystemExit wherever the beat is): yields the ids of the
    messages sent before."""
    from celery.signals import before_task_publish

    sent: list[str] = []

    def stop(headers: dict, **kwargs: object) -> None:
        if len(sent) == count:
            raise SystemExit()
        sent.append(headers["id"])

    before_task_publish.connect(stop, weak=False)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(stop)


def test_a_tick_that_fails_unexpectedly_backs_off_instead_of_ending_the_beat(monkeypatch):
    from prometheus_client import REGISTRY

    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug nobody foresaw")

    def errors() -> float:
        labels = {"kind": "unexpected"}
        return REGISTRY.get_sample_value("schedapp_beat_errors_total", labels) or 0.0

    monkeypatch.setattr(beat, "claim_due_jobs", broken)
    # (the back-off is what the tick sleeps: on its listener, or returned for Celery's loop
    # to sleep; recorded here instead of slept, 3.5 s)
    slept: list[float] = []
    monkeypatch.setattr(scheduler, "_sleep", lambda delay: slept.append(delay) or 0.0)
    before = errors()
    try:
        for _ in range(3):
            scheduler.tick()  # does not raise: Celery's beat loop would end on an exception
    finally:
        scheduler.close()
    # each failure was counted, and the beat backed off (0.5 s, then 1 s, 2 s) between them
    assert errors() - before == 3
    assert slept == [0.5, 1.0, 2.0]


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
    result = lease.claim_due_jobs("beat-1", 10)
    # Then every lease is still valid once the claim has committed
    assert len(result.runs) == 3 and result.restamped
    now = db_now()
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert job.lease_expires_at > now, (job.lease_expires_at, now)


def test_a_beat_stopped_part_way_through_a_batch_gives_back_only_what_it_did_not_send(
    rabbit, monkeypatch
):
    """On RabbitMQ each message is on the broker as its publish returns. A beat stopped after
    two of five (Celery's SIGTERM/SIGINT handler raises SystemExit wherever the beat is)
    keeps the two it sent, gives back the other three, and the next beat sends those three
    alone: each occurrence is published once. Before, all five were given back ("not
    published: beat stopped") and the next beat sent five, two of them a second time."""

    from schedapp.models import JobRun, RunStatus

    own = rabbit.app()
    queue = own.conf.task_default_queue
    jobs = [api.schedule("project.tasks.record", run_at=db_now(), name=f"j{i}") for i in range(5)]
    first = beat.LeaseScheduler(own, lazy=True)
    try:
        with stopped_after_sending(2) as sent, pytest.raises(SystemExit):
            first.tick()
    finally:
        first.close()
    on_broker = [m.headers["id"] for m in test_dispatch_amqp.raw(queue)]
    assert sorted(on_broker) == sorted(sent) and len(sent) == 2
    runs = {r.task_id: r for r in JobRun.objects.filter(job__in=jobs)}
    assert {t for t, r in runs.items() if r.status == RunStatus.DISPATCHED} == set(sent)
    released = {t for t, r in runs.items() if r.status == RunStatus.LOST}
    assert len(released) == 3
    assert all(runs[t].error == "not published: beat stopped" for t in released)
    # the next beat sends the three given back, and nothing else
    second = beat.LeaseScheduler(own, lazy=True, max_interval=0.1)  # no 5 s sleep after it
    try:
        second.tick()
    finally:
        second.close()
    again = [m.headers for m in test_dispatch_amqp.raw(queue)]
    assert sorted(h["schedapp_job"] for h in again) == sorted(
        r.job_id for r in runs.values() if r.status == RunStatus.LOST
    )


# The last statement of the claim's transaction when its batch is not full (next_due): a
# stall after it holds the claim's COMMIT in the proxy.
LAST_OF_THE_CLAIM = b"from schedapp_job where supersede_at is not null"


@pytest.mark.parametrize(
    ("cut_short", "overlap"),
    [
        ("stopped after its claim", "buffer_one"),
        ("stopped in its COMMIT", "buffer_one"),
        ("its COMMIT's reply lost", "buffer_one"),
        # a run of an allow_all job holds a lease of its own: its job moved on at the claim
        ("stopped after its claim", "allow_all"),
        ("its COMMIT's reply lost", "allow_all"),
    ],
)
def test_a_tick_cut_short_once_its_claim_went_to_commit_gives_back_what_it_claimed(
    cut_short, overlap, rabbit, pg_proxy, monkeypatch
):
    """Celery's SIGTERM/SIGINT handler raises SystemExit wherever the beat is. A beat stopped
    between its claim and its publish, or while its claim's COMMIT was on its way (the
    server commits it), or whose COMMIT's reply was lost, gives back what it claimed, as
    one stopped part-way through a publish does, and the next beat sends it at once.
    Before, the claimed runs stayed dispatched and unsent until their lease lapsed: a
    minute late with the default lease, and for ever once no beat was left to reap them
    (CI's chaos run of 2026-12-07: jobs stuck running on expired leases after the beats
    stopped)."""
    import signal
    import threading

    from schedapp.models import JobState, RunStatus
    from schedapp.testing.pgproxy import COMMIT, django_through

    own = rabbit.app()
    queue = own.conf.task_default_queue
    with own.connection_for_write() as conn:  # declared as Celery declares it: empty, it reads
        own.amqp.queues[queue].bind(conn.default_channel).declare()
    first = beat.LeaseScheduler(own, lazy=True)
    monkeypatch.setattr(first, "_sleep", lambda delay: 0.0)

    def celery_beats_handler(signum: int, frame: object) -> None:
        first.close()  # celery.apps.beat's handler: the scheduler closed, then SystemExit
        raise SystemExit()

    def stop_in_the_stalled_commit() -> None:
        wait_until(lambda: pg_proxy.stats()["stalls"] == 1, timeout=30, message="the stall")
        time.sleep(0.3)  # the beat has sent its COMMIT, which the proxy holds
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, celery_beats_handler)
    try:
        with django_through(pg_proxy):
            first.tick()  # its setup: nothing is due
            if overlap == "allow_all":  # one occurrence due: a second ago, then hourly
                first_due = db_now() - timedelta(seconds=1)
                job = api.schedule(
                    "project.tasks.record",
                    interval=timedelta(hours=1),
                    interval_anchor=first_due,
                    overlap="allow_all",
                    max_concurrent=2,
                    name="due",
                )
                Job.objects.filter(pk=job.pk).update(scheduled_for=first_due, next_run_at=first_due)
            else:
                job = api.schedule("project.tasks.record", run_at=db_now(), name="due")
            if cut_short == "stopped after its claim":
                claim, stops = beat.claim_due_jobs, [signal.SIGTERM]  # this tick's claim only

                def claim_then_stop(*args: object, **kwargs: object) -> object:
                    claimed = claim(*args, **kwargs)
                    if stops:
                        os.kill(os.getpid(), stops.pop())
                    return claimed

                monkeypatch.setattr(beat, "claim_due_jobs", claim_then_stop)
            elif cut_short == "stopped in its COMMIT":
                # psycopg cancels the COMMIT (a no-op: the proxy holds it), then waits up to
                # 5 s for its reply before it raises the SystemExit: the stall ends first
                pg_proxy.stall_after(LAST_OF_THE_CLAIM, seconds=2.0)
                threading.Thread(target=stop_in_the_stalled_commit, daemon=True).start()
            else:
                pg_proxy.cut_after(COMMIT)  # the server commits; the beat sees a lost connection
            if cut_short.startswith("stopped"):
                with pytest.raises(SystemExit):
                    first.tick()
            else:
                first.tick()  # fails as on a lost connection, and backs off
            stats = pg_proxy.stats()
    finally:
        signal.signal(signal.SIGTERM, previous)
        first.close()
    if cut_short == "stopped in its COMMIT":
        assert stats["stalls"] == 1
    if cut_short == "its COMMIT's reply lost":
        assert stats["cuts"] == 1
    # Then nothing was sent, and the claim was given back: its run is lost, never started,
    # and the occurrence is due again (the job's; an allow_all job's as a retry due now)
    assert test_dispatch_amqp.raw(queue) == []
    run, *retry = JobRun.objects.filter(job=job).order_by("id")
    assert run.status == RunStatus.LOST and run.started_at is None
    assert run.lease_expires_at is None
    if cut_short.startswith("stopped"):
        assert run.error == "not published: beat stopped"
    else:
        assert run.error.startswith("not published: the tick failed after its claim: ")
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    if overlap == "allow_all":
        (again,) = retry
        assert (again.scheduled_for, again.attempt) == (run.scheduled_for, run.attempt)
        assert again.retry_at <= db_now()
    # and the next beat sends it now, not a lease later
    second = beat.LeaseScheduler(own, lazy=True, max_interval=0.1)
    try:
        second.tick()
    finally:
        second.close()
    (message,) = test_dispatch_amqp.raw(queue)
    assert message.headers["schedapp_job"] == job.pk
    sent = JobRun.objects.filter(job=job).exclude(pk=run.pk).get()
    assert (sent.scheduled_for, sent.status) == (run.scheduled_for, RunStatus.DISPATCHED)


def test_a_beat_stopped_part_way_through_a_backfills_batch_gives_back_what_it_did_not_send(
    rabbit, monkeypatch
):
    """A backfill's runs are published by the tick after the claim's. A beat stopped after
    the first of three keeps the one it sent and gives the two others back at once, as it
    does a claim's: each closed lost, its occurrence sent again by the next beat as the same
    attempt. Before, the two stayed dispatched and unsent under their own lease, a minute
    here, holding two of the job's max_concurrent slots."""

    from schedapp.models import RunKind, RunStatus

    own = rabbit.app()
    queue = own.conf.task_default_queue
    job = backfilling(occurrences=3)
    first = beat.LeaseScheduler(own, lazy=True)
    try:
        first.setup_schedule()
        # nothing of the job's own is due: the backfill's three are sent
        with stopped_after_sending(1) as sent, pytest.raises(SystemExit):
            first._work()
    finally:
        first.close()
    assert [m.headers["id"] for m in test_dispatch_amqp.raw(queue)] == sent
    runs = list(JobRun.objects.filter(job=job).order_by("id"))
    assert {r.kind for r in runs} == {RunKind.BACKFILL}
    kept = [r for r in runs if r.task_id in sent]
    assert [r.status for r in kept] == [RunStatus.DISPATCHED]
    lost = [r for r in runs if r.status == RunStatus.LOST]
    assert len(lost) == 2
    assert all(
        r.error == "not published: beat stopped" and r.lease_expires_at is None for r in lost
    )
    # the next beat sends those two occurrences again, and nothing else
    second = beat.LeaseScheduler(own, lazy=True, max_interval=0.1)
    try:
        second.setup_schedule()
        second._work()
    finally:
        second.close()
    again = test_dispatch_amqp.raw(queue)
    resent = JobRun.objects.filter(task_id__in=[m.headers["id"] for m in again])
    assert sorted(r.scheduled_for for r in resent) == sorted(r.scheduled_for for r in lost)
    assert {(r.kind, r.attempt) for r in resent} == {(RunKind.BACKFILL, 1)}


def test_a_backfills_runs_the_broker_did_not_take_are_given_back_at_once(
    private_redis, monkeypatch
):
    """A backfill's runs whose publish fails (the broker down) are given back as a claim's
    are: closed lost, their occurrences sent again by the next beat once the broker is back,
    the same attempt. Before, they stayed dispatched under their own lease until the reaper
    found it lapsed (a minute here)."""
    from celery import Celery

    from schedapp.models import RunKind, RunStatus

    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery prefers it to any config
    own = Celery("down", broker=private_redis.url, set_as_current=False)
    own.conf.broker_transport_options = {"max_retries": 1}  # fail at once
    job = backfilling(occurrences=2)
    private_redis.stop()
    first = beat.LeaseScheduler(own, lazy=True)
    try:
        first.setup_schedule()
        first._work()  # the backfill's two fail to publish
    finally:
        first.close()
    lost = list(JobRun.objects.filter(job=job, status=RunStatus.LOST))
    assert len(lost) == 2 and all(r.error.startswith("not published: ") for r in lost)
    retries = JobRun.objects.filter(job=job, status=RunStatus.DISPATCHED, retry_at__isnull=False)
    assert sorted((r.scheduled_for, r.kind, r.attempt) for r in retries) == sorted(
        (r.scheduled_for, RunKind.BACKFILL, 1) for r in lost
    )


@pytest.mark.parametrize("given", ["--max-interval", "beat_max_loop_interval"])
def test_a_beat_never_sleeps_longer_than_its_max_interval(given, monkeypatch):
    """``celery beat --max-interval`` (or ``beat_max_loop_interval``): Celery's beat never
    sleeps longer between looks at the schedule. A job written without a notification (by
    SQL, another tool) is found within it. Before, a beat with nothing due slept its own 5 s
    ceiling (``SCHEDAPP_MAX_SLEEP``) whatever the max interval."""
    app = celery_app()
    if given == "--max-interval":
        scheduler = beat.LeaseScheduler(app, max_interval=0.5, lazy=True)
    else:
        monkeypatch.setitem(app.conf, "beat_max_loop_interval", 0.5)
        scheduler = beat.LeaseScheduler(app, lazy=True)
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


def test_a_forked_process_forgets_the_connection_it_inherited_and_leaves_the_parents_alone():
    """A beat forked from a worker (``celery worker -B``) that held a connection drops it
    before its first query: its statements go to a session of its own, and the worker's
    session lives on (closing the inherited connection as usual would have ended it)."""
    import os

    from schedapp.db import forget_inherited_connections

    def backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    parents = backend()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the beat's process
        try:
            forgotten = forget_inherited_connections()
            os.write(write, f"{forgotten} {backend()}".encode())
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    forgotten, childs = os.read(read, 100).decode().split()
    assert (forgotten, int(childs) != parents) == ("1", True)
    assert backend() == parents  # the parent's session was not ended
    assert forget_inherited_connections() == 0  # the parent inherited nothing


@pytest.mark.parametrize(
    "fast",
    [True, False],  # both paths by default: the tick no longer sleeps 5 s after (max_interval)
    ids=["redis-fast-path", "kombu-publish"],
)
def test_a_beat_whose_clock_is_an_hour_behind_dates_expires_by_the_database(
    broker_url, fast, monkeypatch
):
    """A message's ``expires`` given in seconds is dated from the database's clock (the
    claim's now() and the time since), not the beat host's. Before, a beat an hour behind
    sent ``expires`` an hour in the past: every worker discarded every occurrence of the job
    as "expired before a worker started it"."""
    import json
    from datetime import datetime

    import redis
    from django.conf import settings

    from project.celery import app

    job = api.schedule(
        "project.tasks.record", run_at=db_now(), name="expiring", message_options={"expires": 30}
    )
    behind = timedelta(hours=1)
    real_now = app.now
    monkeypatch.setattr(app, "now", lambda: real_now() - behind)  # as apply_async reads it
    if not fast:
        monkeypatch.setattr(dispatch, "redis_internals_match", lambda *a, **k: False)
    # max_interval: the tick's sleep after it dispatched (5 s on its LISTEN connection) cut
    scheduler = beat.LeaseScheduler(app, lazy=True, max_interval=0.1)
    try:
        before = db_now()
        scheduler.tick()
        after = db_now()
    finally:
        scheduler.close()
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    (message,) = [json.loads(raw) for raw in client.lrange("celery", 0, -1)]
    assert message["headers"]["schedapp_job"] == job.id
    expires = datetime.fromisoformat(message["headers"]["expires"])
    # before: about 2026-..T..: an hour before the database's now
    assert before + timedelta(seconds=29) <= expires <= after + timedelta(seconds=31), (
        before,
        expires,
    )


def test_the_look_for_backfills_rides_in_the_claim_and_a_new_backfill_still_starts_at_once(
    monkeypatch,
):
    """With no backfill running, a beat's look for one (at most every quarter second) is a
    statement in its claim's transaction: ``backfill.advance`` (a transaction of its own, a
    commit a look) is not called. Before, every look was that transaction: 0.0009 commits
    per job of a 100,000-job burst. A backfill started between two looks is advanced, its
    first runs published, by the first tick after the next look is due."""
    from schedapp.lease import backfill as engine
    from schedapp.models import RunKind

    calls: list[float] = []
    advance = engine.advance

    def counted(*args, **kwargs):
        calls.append(time.monotonic())
        return advance(*args, **kwargs)

    monkeypatch.setattr(engine, "advance", counted)
    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
    published: list = []

    def publish(runs, result):
        published.extend(runs)
        result.published.extend(runs)

    try:
        scheduler.setup_schedule()
        monkeypatch.setattr(scheduler._dispatcher, "publish", publish)
        for _ in range(4):  # nothing running: looks, in the claim only
            scheduler._work()
            time.sleep(0.1)
        assert calls == []
        job = backfilling(occurrences=3)
        time.sleep(0.3)  # the next look is due
        scheduler._work()
        assert len(calls) == 1
        assert published and {r.job_id for r in published} == {job.pk}
        kinds = set(JobRun.objects.filter(job=job).values_list("kind", flat=True))
        assert kinds == {RunKind.BACKFILL}
    finally:
        scheduler.close()
