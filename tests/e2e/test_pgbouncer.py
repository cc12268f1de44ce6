"""schedapp behind a real PgBouncer in transaction pooling mode (``pool_mode = transaction``),
as production Celery/Django fleets often run it: beats, workers, the reaper, the Python API
and the admin, every database connection through it (``schedapp.testing.servers.PgBouncer``).

Under transaction pooling a client's consecutive transactions may run on different server
sessions, and a server session serves many clients in turn: anything set for a session
(``SET``, ``LISTEN``, prepared statements, holdable cursors) is lost to its client and left
to the next one. PgBouncer also replaces its server connections (``server_lifetime``, an hour
by default), so a client's session settings vanish even from a pool of one.
"""

from __future__ import annotations

import io
import re
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import OperationalError, transaction
from django.urls import reverse

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, Node, RunStatus
from schedapp.testing.pgproxy import PgProxy, django_through
from schedapp.testing.processes import wait_until
from tests.e2e import renewed_past_its_lease

pytestmark = [pytest.mark.e2e]

# What a process logs when a statement fails on the database side (the retries' and the beat's
# lines, psycopg's errors), and what pgbouncer's own statement errors say.
DATABASE_TROUBLE = re.compile(
    r"database (unavailable|conflict)|beat tick failed|psycopg|prepared statement"
    r"|cursor \S+ does not exist|server conn crashed|idle-in-transaction"
)


def runs_of(job: Job) -> list[JobRun]:
    return list(JobRun.objects.filter(job=job).order_by("id"))


def row_lock_free(job_id: int) -> bool:
    """Whether the job's row can be locked right now (no transaction holds it)."""
    try:
        with transaction.atomic():
            list(Job.objects.select_for_update(nowait=True).filter(pk=job_id).values("id"))
    except OperationalError:  # lock not available
        return False
    return True


def test_a_fleet_behind_a_transaction_pooling_pgbouncer_runs_every_occurrence_once(
    pgbouncer, fleet_through, admin_client
):
    # Given a transaction-pooling PgBouncer with four server connections, and a beat, workers,
    # this test's API calls and the admin all connected through it (Django's defaults:
    # no prepared statements, server-side cursors allowed)
    pgbouncer.start(pool_size=4)
    fleet = fleet_through(pgbouncer)
    with django_through(pgbouncer):
        fleet.beat()
        fleet.worker(concurrency=2, heartbeat=1)
        doomed = fleet.worker(concurrency=1, pool="solo", extra_args=["-Q", "doomed"])
        now = db_now()
        # ... jobs that succeed: 20 one-offs written with COPY, a recurring job every 2 s
        api.schedule_many(
            {
                "task": "project.tasks.record",
                "kwargs": {"label": f"once-{i}"},
                "run_at": now,
                "name": f"once-{i}",
            }
            for i in range(20)
        )
        every = api.schedule(
            "project.tasks.record", kwargs={"label": "every"}, interval=2, name="every"
        )
        # ... a task twice as long as its lease (renewed while it runs)
        long = api.schedule(
            "project.tasks.record",
            kwargs={"label": "long", "sleep": 6},
            run_at=now,
            lease_seconds=3,  # three heartbeats: a renewal may wait for a pooled connection
            name="long",
        )
        # ... one that always fails (dead after its retries), one that fails twice then works
        fails = api.schedule(
            "project.tasks.fail",
            kwargs={"label": "fails"},
            run_at=now,
            max_retries=2,
            retry_backoff=1,
            name="fails",
        )
        flaky = api.schedule(
            "project.tasks.flaky",
            kwargs={"label": "flaky", "failures": 2},
            run_at=now,
            max_retries=3,
            retry_backoff=1,
            name="flaky",
        )
        # ... and one whose worker is killed while it runs
        killed = api.schedule(
            "project.tasks.record",
            kwargs={"label": "killed", "sleep": 4},
            run_at=now,
            lease_seconds=3,
            retry_backoff=0,
            queue="doomed",
            name="killed",
        )

        # When the worker running "killed" is SIGKILLed mid-task and another takes its queue
        wait_until(
            lambda: Execution.objects.filter(label="killed").exists(),
            timeout=30,
            message="the doomed task started",
        )
        doomed.kill()
        fleet.worker(concurrency=1, pool="solo", extra_args=["-Q", "doomed"])
        finals = (JobState.SUCCEEDED, JobState.DEAD)
        wait_until(
            lambda: (
                Job.objects.filter(
                    pk__in=[long.pk, fails.pk, flaky.pk, killed.pk], state__in=finals
                ).count()
                == 4
            ),
            timeout=60,
            message="the jobs finished",
        )
        wait_until(
            lambda: (
                Job.objects.filter(name__startswith="once-", state=JobState.SUCCEEDED).count() == 20
            ),
            timeout=30,
            message="the one-offs finished",
        )

        # ... and an operator uses the admin: lists, a job's page, the overview, the runs,
        # then pauses, resumes and runs the recurring job from the changelist
        for url in (
            reverse("admin:schedapp_job_changelist"),
            reverse("admin:schedapp_job_changelist") + "?state__exact=dead",
            reverse("admin:schedapp_job_change", args=[every.pk]),
            reverse("admin:schedapp_job_overview"),
            reverse("admin:schedapp_jobrun_changelist"),
        ):
            assert admin_client.get(url).status_code == 200, url
        for action in ("pause", "resume", "run_now"):
            response = admin_client.post(
                reverse("admin:schedapp_job_changelist"),
                {"action": action, "_selected_action": [every.pk], "index": 0},
                follow=True,
            )
            messages = [str(m) for m in response.context["messages"]]
            assert any("1 job" in m for m in messages), (action, messages)
        ran_before = JobRun.objects.filter(job=every).count()
        wait_until(
            lambda: JobRun.objects.filter(job=every).count() > ran_before,
            timeout=20,
            message="the resumed job ran again",
        )

        # Then every one-off executed exactly once
        once = Counter(
            Execution.objects.filter(label__startswith="once-").values_list("label", flat=True)
        )
        assert once == {f"once-{i}": 1 for i in range(20)}
        # ... the long task once, its lease renewed by the worker's heartbeats
        (run,) = runs_of(long)
        assert (run.status, run.stale) == (RunStatus.SUCCEEDED, False)
        assert renewed_past_its_lease(run, 3), (run.started_at, run.finished_at, run.heartbeats)
        assert Execution.objects.filter(label="long").count() == 1
        # ... the failing task three times, then dead; the flaky one on its third attempt
        assert [(r.attempt, r.status) for r in runs_of(fails)] == [
            (1, RunStatus.FAILED),
            (2, RunStatus.FAILED),
            (3, RunStatus.FAILED),
        ]
        assert "RuntimeError: fails failed on purpose" in Job.objects.get(pk=fails.pk).last_error
        assert [r.status for r in runs_of(flaky)] == [
            RunStatus.FAILED,
            RunStatus.FAILED,
            RunStatus.SUCCEEDED,
        ]
        # ... the killed run was reaped as lost, and its occurrence ran again to its end
        started = [r for r in runs_of(killed) if r.started_at is not None]
        assert [r.status for r in started] == [RunStatus.LOST, RunStatus.SUCCEEDED]
        assert Job.objects.get(pk=killed.pk).state == JobState.SUCCEEDED
        # ... the recurring job ran, one occurrence at a time, none of them lost
        statuses = [r.status for r in runs_of(every)]
        assert statuses.count(RunStatus.SUCCEEDED) >= 3, statuses
        assert sum(s in (RunStatus.DISPATCHED, RunStatus.RUNNING) for s in statuses) <= 1
        assert set(statuses) <= {RunStatus.SUCCEEDED, RunStatus.DISPATCHED, RunStatus.RUNNING}

        # ... and the commands work through it: the fleet check passes (a beat alive, nothing
        # waiting), and the finished runs are pruned in batches of short transactions
        call_command("schedapp_status", "--check", stdout=io.StringIO())  # SystemExit(1) if not
        out = io.StringIO()
        call_command("schedapp_prune", "--older-than", "1s", "--batch-size", "10", stdout=out)
        assert not JobRun.objects.filter(job__name__startswith="once-").exists(), out.getvalue()
    # ... and no process met a database error on the way
    trouble = [line for line in fleet.logs().splitlines() if DATABASE_TROUBLE.search(line)]
    assert not trouble, "\n".join(trouble[:20])


def test_a_beat_behind_pgbouncer_polls_every_second_for_new_jobs(pgbouncer, fleet_through):
    # Given a beat connected through a transaction-pooling PgBouncer, which passes no
    # notification to a client between its transactions (the beat may sleep 30 s when
    # something can wake it)
    pgbouncer.start(pool_size=2)
    fleet = fleet_through(pgbouncer)
    beat = fleet.beat(settings={"SCHEDAPP_MAX_SLEEP": 30})
    time.sleep(1.5)  # its first tick is over: it sleeps
    # When a job due now is scheduled
    with django_through(pgbouncer):
        job = api.schedule("project.tasks.record", run_at=db_now(), name="new")
        # Then the beat dispatches it within about a second, as a beat without LISTEN does
        wait_until(
            lambda: JobRun.objects.filter(job=job).exists(),
            timeout=4,
            message="the new job dispatched",
        )
    # ... and it said that it polls, and why
    (started,) = [line for line in beat.log().splitlines() if " started: " in line]
    assert started.endswith("polling)"), started
    assert "no notification reaches this beat" in beat.log()


def test_a_beat_behind_pgbouncer_leaves_no_timeout_on_the_sessions_it_shares(
    pgbouncer, fleet_through
):
    # Given a PgBouncer with a single server connection, shared by a beat (which has
    # PostgreSQL end its own transactions idle for more than 1 s) and this test's connection
    pgbouncer.start(pool_size=1)
    fleet_through(pgbouncer).beat(settings={"SCHEDAPP_BEAT_TRANSACTION_TIMEOUT": 1})
    with django_through(pgbouncer):
        # When another client of the pool (a web request, a task) keeps a transaction open
        # for 2 s between two statements
        with transaction.atomic():
            Job.objects.exists()
            time.sleep(2)
            # Then its transaction goes on: the beat's timeout did not stay on the session
            assert not Job.objects.exists()


def test_a_beat_stalled_in_its_claim_behind_pgbouncer_lets_go_of_its_rows_in_time(
    pgbouncer, fleet_through
):
    # Given a PgBouncer that replaces its server connections after a second (what its
    # server_lifetime does every hour by default), a beat connected through it (behind a
    # proxy that can stall it) which has PostgreSQL end its transactions idle for over 1 s
    pgbouncer.start(pool_size=2, server_lifetime=1)
    with PgProxy((pgbouncer.host, pgbouncer.port)) as proxy:
        fleet = fleet_through(proxy)
        fleet.beat(settings={"SCHEDAPP_BEAT_TRANSACTION_TIMEOUT": 1})
        job = api.schedule("project.tasks.record", cron="0 3 1 1 *", name="late")
        time.sleep(3)  # the beat has been running on fresh server connections for a while
        # When the beat claims the job, found late, and stops right after taking its row
        # (its misfire write) for 15 s, as a beat SIGSTOPped or swapped out mid-claim would
        proxy.stall_after(b'"missed_runs" = (', seconds=15, app="beat1")
        away = db_now() - timedelta(hours=1)
        Job.objects.filter(pk=job.pk).update(scheduled_for=away, next_run_at=away)
        wait_until(lambda: not row_lock_free(job.pk), timeout=10, message="the beat locked the job")
        # Then PostgreSQL ends its transaction within the timeout, and the row is free again
        wait_until(lambda: row_lock_free(job.pk), timeout=4, message="the stalled claim released")
        proxy.clear()


def test_a_beat_stopped_while_its_query_waits_for_a_pgbouncer_connection_exits_promptly(
    pgbouncer, fleet_through
):
    # Given a PgBouncer with a single server connection and a beat connected through it
    pgbouncer.start(pool_size=1)
    beat = fleet_through(pgbouncer).beat()
    wait_until(lambda: Node.objects.filter(kind=Node.Kind.BEAT).exists(), timeout=10)
    with django_through(pgbouncer):
        # ... whose next statement waits for that connection, which another client holds
        with transaction.atomic():
            Job.objects.exists()
            time.sleep(1.5)
            # When the beat is stopped (SIGTERM: a deploy, a scale-down) meanwhile
            beat.signal_group(signal.SIGTERM)
            time.sleep(1)
    # Then it exits within seconds of the connection coming free, having said so and taken
    # itself off the fleet's list of beats
    beat.popen.wait(timeout=10)
    assert "stopped" in beat.log().splitlines()[-1]
    assert not Node.objects.filter(kind=Node.Kind.BEAT).exists()
