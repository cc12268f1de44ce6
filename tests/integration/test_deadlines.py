"""Deadlines per job (docs/semantics.md, Deadlines): a late occurrence skipped by the claim
is recorded in the ledger; each breach (late, overrunning, missed finish_by, failing, dead)
is recorded once per incident, its signal sent once after the recording commits, and a
``recovered`` recorded and sent when it ends. The detection runs on both stores."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schedapp import api, explain
from schedapp.db import db_now
from schedapp.lease import claim_due_jobs
from schedapp.models import Job, JobRun, JobState, Occurrence

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "project.tasks.record"
MINUTE = timedelta(minutes=1)


def job_found(ago: timedelta, every: timedelta = 5 * MINUTE, **options) -> Job:
    """An interval job whose pending occurrence was ``ago`` before the database's now."""
    occurrence = db_now() - ago
    job = api.schedule(TASK, interval=every, interval_anchor=occurrence, name="j", **options)
    Job.objects.filter(pk=job.pk).update(scheduled_for=occurrence, next_run_at=occurrence)
    return Job.objects.get(pk=job.pk)


# --- skip_late: the claim ----------------------------------------------------------------------


def test_an_occurrence_past_its_start_deadline_is_skipped_and_recorded_late():
    # Given a job skipping late occurrences, 30 s past one with a 10 s deadline (grace 60 s)
    job = job_found(timedelta(seconds=30), start_deadline=10, skip_late=True)
    missed = job.scheduled_for
    # When a beat claims
    result = claim_due_jobs("beat-1", 10)
    # Then it runs nothing, records the occurrence as late, and waits for the next one
    assert result.runs == [] and not JobRun.objects.filter(job=job).exists()
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.scheduled_for, record.count) == ("late", missed, 1)
    assert "start deadline (0:00:10)" in record.detail
    job.refresh_from_db()
    assert (job.state, job.scheduled_for) == (JobState.SCHEDULED, missed + 5 * MINUTE)
    answer = explain.explain(job, missed)
    assert answer.entry is not None and answer.entry.fate == "late"


def test_without_skip_late_the_late_occurrence_runs():
    job = job_found(timedelta(seconds=30), start_deadline=10)
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert run.scheduled_for == job.scheduled_for
    assert not Occurrence.objects.filter(job=job).exists()


def test_older_occurrences_are_late_and_the_policy_decides_among_those_within_the_deadline():
    # Given a minutely job back after 10 minutes, skipping occurrences older than 2 minutes,
    # under run_all: the two within the deadline run, the eight before are late
    job = job_found(
        timedelta(minutes=9, seconds=30),
        every=MINUTE,
        start_deadline=120,
        skip_late=True,
        misfire_policy="run_all",
    )
    first = job.scheduled_for
    (run,) = claim_due_jobs("beat-1", 10).runs
    [late] = Occurrence.objects.filter(job=job, fate="late")
    assert (late.scheduled_for, late.count) == (first, 8)
    assert run.scheduled_for == first + 8 * MINUTE


# --- breaches: detection on both stores ----------------------------------------------------------

ALIASES = ["default", "portable"]


@pytest.fixture
def heard():
    """Every deadline signal sent, as (signal name, kind, job id), in order."""
    from schedapp import signals

    names = {s: k for k, s in signals.BREACH_SIGNALS.items()}
    names[signals.job_recovered] = "recovered"
    events: list[tuple[str, str, int]] = []

    def receiver(sender, breach, signal, **kwargs):
        events.append((names[signal], breach.kind, breach.job_id))

    for signal in names:
        signal.connect(receiver, dispatch_uid="test-deadlines")
    yield events
    for signal in names:
        signal.disconnect(dispatch_uid="test-deadlines")


def now_of(alias: str):
    from schedapp.deadlines import _now

    return _now(alias)


def make(alias: str, name: str = "j", **fields) -> Job:
    """A job written straight to the alias's database: an interval job, its occurrence a
    second ago, tagged."""
    now = now_of(alias)
    values = {
        "task": TASK,
        "interval": 5 * MINUTE,
        "interval_anchor": now,
        "timezone": "UTC",
        "next_run_at": now - timedelta(seconds=1),
        "scheduled_for": now - timedelta(seconds=1),
        "tags": ["team-a"],
        **fields,
    }
    return Job.objects.using(alias).create(name=name, **values)


def run(alias: str, job: Job, **fields) -> JobRun:
    values = {
        "token": job.token,
        "scheduled_for": job.scheduled_for,
        "due_at": job.scheduled_for,
        "dispatched_at": job.scheduled_for,
        "task_id": f"schedapp:{job.pk}:{job.token}",
        **fields,
    }
    return JobRun.objects.using(alias).create(job=job, **values)


def check(alias: str):
    from schedapp.deadlines import check_deadlines

    return check_deadlines(using=alias)


def breaches(alias: str, job: Job) -> list[tuple[str, bool]]:
    from schedapp.models import Breach

    rows = Breach.objects.using(alias).filter(job_id=job.pk).order_by("id")
    return [(b.kind, b.cleared_at is not None) for b in rows]


@pytest.fixture(params=ALIASES)
def alias(request) -> str:
    return request.param


pytestmark_both = pytest.mark.django_db(transaction=True, databases=["default", "portable"])


@pytestmark_both
def test_late_is_recorded_once_then_recovered_when_its_run_starts(alias, heard):
    # Given a job whose occurrence was 30 s ago, claimed, its run waiting for a worker
    now = now_of(alias)
    job = make(alias, start_deadline=timedelta(seconds=10), state=JobState.RUNNING,
               scheduled_for=now - timedelta(seconds=30), lease_expires_at=now + MINUTE,
               token=1)
    waiting = run(alias, job, status="dispatched")
    fine = make(alias, "fine", start_deadline=timedelta(minutes=5))
    # When the deadline pass runs twice
    first, second = check(alias), check(alias)
    # Then one late breach, one signal, and nothing for the job within its deadline
    assert [e.kind for e in first.opened] == ["late"] and second.opened == []
    assert breaches(alias, job) == [("late", False)] and breaches(alias, fine) == []
    assert heard == [("late", "late", job.pk)]
    # When its run starts, then the breach is cleared and recovered is sent, once
    JobRun.objects.using(alias).filter(pk=waiting.pk).update(status="running", started_at=now)
    assert [e.detail for e in check(alias).recovered] == ["started"]
    assert check(alias).recovered == []
    assert breaches(alias, job) == [("late", True)]
    assert heard[1:] == [("recovered", "late", job.pk)]


@pytestmark_both
def test_an_occurrence_no_beat_claimed_is_late_and_recovers_when_the_job_moves_on(alias, heard):
    now = now_of(alias)
    job = make(alias, start_deadline=timedelta(seconds=10), scheduled_for=now - MINUTE)
    check(alias)
    assert breaches(alias, job) == [("late", False)]
    Job.objects.using(alias).filter(pk=job.pk).update(scheduled_for=now + 4 * MINUTE)
    (recovered,) = check(alias).recovered
    assert "moved on" in recovered.detail
    assert heard == [("late", "late", job.pk), ("recovered", "late", job.pk)]


@pytestmark_both
def test_overrunning_is_recorded_once_then_recovered_when_the_run_ends(alias, heard):
    now = now_of(alias)
    job = make(alias, max_runtime=timedelta(seconds=30), state=JobState.RUNNING,
               lease_expires_at=now + MINUTE, token=3)
    running = run(alias, job, status="running", started_at=now - MINUTE)
    short = make(alias, "short", max_runtime=timedelta(minutes=5), state=JobState.RUNNING,
                 lease_expires_at=now + MINUTE, token=1)
    run(alias, short, status="running", started_at=now - MINUTE)
    found = check(alias)
    assert [e.kind for e in found.opened] == ["overrunning"] and found.to_revoke == []
    assert check(alias).opened == []
    JobRun.objects.using(alias).filter(pk=running.pk).update(status="succeeded", finished_at=now)
    Job.objects.using(alias).filter(pk=job.pk).update(state=JobState.SCHEDULED)
    assert [e.detail for e in check(alias).recovered] == ["the run ended"]
    assert breaches(alias, job) == [("overrunning", True)] and breaches(alias, short) == []
    assert heard == [("overrunning", "overrunning", job.pk), ("recovered", "overrunning", job.pk)]


@pytestmark_both
def test_an_overrun_the_job_asks_to_revoke_is_handed_to_the_beat(alias):
    now = now_of(alias)
    job = make(alias, max_runtime=timedelta(seconds=30), revoke_overrun=True,
               state=JobState.RUNNING, lease_expires_at=now + MINUTE, token=7)
    run(alias, job, status="running", started_at=now - MINUTE)
    assert check(alias).to_revoke == [f"schedapp:{job.pk}:7"]
    assert check(alias).to_revoke == []  # once per incident


@pytestmark_both
def test_failing_after_n_failed_attempts_then_recovered_by_a_success(alias, heard):
    from schedapp.deadlines import record_failure

    now = now_of(alias)
    job = make(alias, alert_after_failures=3)
    for token in (1, 2):
        run(alias, job, token=token, status="failed", finished_at=now)
    with transaction_on(alias):
        assert not record_failure(job, job.scheduled_for, using=alias)  # two in a row
    run(alias, job, token=3, status="failed", finished_at=now)
    with transaction_on(alias):
        assert record_failure(job, job.scheduled_for, using=alias)
        assert heard == []  # not before the commit
    assert heard == [("failing", "failing", job.pk)]
    run(alias, job, token=4, status="failed", finished_at=now)
    with transaction_on(alias):
        assert not record_failure(job, job.scheduled_for, using=alias)  # still the same incident
    Job.objects.using(alias).filter(pk=job.pk).update(
        last_status="succeeded", last_run_at=now_of(alias) + timedelta(seconds=1)
    )
    assert [e.kind for e in check(alias).recovered] == ["failing"]
    assert heard[1:] == [("recovered", "failing", job.pk)]


@pytestmark_both
def test_dead_is_recorded_once_then_recovered_when_requeued(alias, heard):
    job = make(alias, state=JobState.DEAD, next_run_at=None, last_error="boom\ntrace")
    assert [e.detail for e in check(alias).opened] == ["dead: boom"]
    assert check(alias).opened == []
    Job.objects.using(alias).filter(pk=job.pk).update(
        state=JobState.SCHEDULED, next_run_at=now_of(alias) + MINUTE
    )
    check(alias)
    assert heard == [("dead", "dead", job.pk), ("recovered", "dead", job.pk)]


@pytestmark_both
def test_missed_finish_by_once_a_day_then_recovered_by_a_success(alias, heard):
    from datetime import time as clock

    now = now_of(alias)
    # Given a job due at midnight UTC each day that must be done a moment ago, armed for
    # today's deadline, which has just passed (its occurrence never succeeded)
    deadline = now - timedelta(seconds=5)
    job = make(
        alias,
        cron="0 0 * * *",
        interval=None,
        interval_anchor=None,
        finish_by=clock(deadline.hour, deadline.minute, deadline.second, deadline.microsecond),
        finish_by_at=deadline,
    )
    found = check(alias)
    assert [e.kind for e in found.opened] == ["missed_finish_by"]
    job.refresh_from_db(using=alias)
    assert job.finish_by_at == deadline + timedelta(days=1)  # armed for tomorrow
    assert check(alias).opened == []
    Job.objects.using(alias).filter(pk=job.pk).update(
        last_status="succeeded", last_run_at=now_of(alias) + timedelta(seconds=1)
    )
    assert [e.detail for e in check(alias).recovered] == ["succeeded"]
    assert heard == [("missed_finish_by", "missed_finish_by", job.pk),
                     ("recovered", "missed_finish_by", job.pk)]


@pytestmark_both
def test_a_day_whose_occurrence_succeeded_in_time_or_had_none_is_not_missed(alias, heard):
    from datetime import time as clock

    now = now_of(alias)
    deadline = now - timedelta(seconds=5)
    finish = clock(deadline.hour, deadline.minute, deadline.second, deadline.microsecond)
    done = make(alias, "done", cron="0 0 * * *", interval=None, interval_anchor=None,
                finish_by=finish, finish_by_at=deadline)
    midnight = deadline.replace(hour=0, minute=0, second=0, microsecond=0)
    run(alias, done, scheduled_for=midnight, status="succeeded",
        finished_at=midnight + timedelta(microseconds=1))
    # (a yearly job whose occurrence is not today)
    other_day = (deadline + timedelta(days=2))
    none_today = make(alias, "none", cron=f"0 0 {other_day.day} {other_day.month} *",
                      interval=None, interval_anchor=None, finish_by=finish,
                      finish_by_at=deadline)
    assert check(alias).opened == []
    assert breaches(alias, done) == breaches(alias, none_today) == [] and heard == []


@pytestmark_both
def test_a_receiver_that_raises_neither_stops_the_pass_nor_the_others(alias, heard):
    from schedapp import signals

    def broken(sender, **kwargs):
        raise RuntimeError("receiver down")

    signals.job_dead.connect(broken, dispatch_uid="broken")
    try:
        make(alias, state=JobState.DEAD, next_run_at=None)
        assert len(check(alias).opened) == 1
    finally:
        signals.job_dead.disconnect(dispatch_uid="broken")
    assert [h[0] for h in heard] == ["dead"]


def transaction_on(alias: str):
    from django.db import transaction

    return transaction.atomic(using=alias)


def test_failing_through_the_workers_completion_then_recovered_by_its_success(heard):
    """The real path on PostgreSQL: claims, doors and completions; the third failed attempt in
    a row makes the job failing as its failure is written; the success that follows clears it."""
    from schedapp import lease

    job = api.schedule(TASK, interval=MINUTE, name="f", alert_after_failures=3, max_retries=5,
                       retry_backoff=0)
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - MINUTE)
    outcomes = [lease.FAILED, lease.FAILED, lease.FAILED, lease.SUCCEEDED]
    for n, outcome in enumerate(outcomes):
        (claimed,) = claim_due_jobs("beat-1", 10).runs
        assert lease.admit_run(claimed.job_id, claimed.token, "w1", admission=f"a{n}") == "admitted"
        assert lease.complete_run(claimed.job_id, claimed.token, outcome, error="boom").applied
        Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - MINUTE)
        if n == 1:
            assert heard == []
    assert heard == [("failing", "failing", job.pk)]
    check("default")
    assert heard[1:] == [("recovered", "failing", job.pk)]


def test_breaches_are_on_the_jobs_timeline_and_its_admin_page(admin_client):
    # Given a job whose run started late (its breach recovered), and a pending late occurrence
    now = db_now()
    job = make("default", start_deadline=timedelta(seconds=10), state=JobState.RUNNING,
               scheduled_for=now - 2 * MINUTE, lease_expires_at=now + MINUTE, token=1)
    waiting = run("default", job, status="dispatched")
    check("default")
    JobRun.objects.filter(pk=waiting.pk).update(status="running", started_at=now)
    check("default")
    # When the timeline is read, then the ran occurrence carries its breach and recovery
    (entry,) = explain.timeline(job)
    assert entry.fate == "ran"
    assert [n.text for n in entry.breaches] == [
        "late: not started within its start deadline (0:00:10); recovered (started)"
    ]
    # And a breach at a time with no run is an entry of its own
    Job.objects.filter(pk=job.pk).update(state=JobState.DEAD)
    check("default")
    kinds = [(e.fate, [n.kind for n in e.breaches]) for e in explain.timeline(job)]
    assert kinds == [("ran", ["late", "dead"])]  # (the dead job's occurrence is that one)
    page = admin_client.get(f"/admin/schedapp/job/{job.pk}/timeline/")
    assert page.status_code == 200
    assert "late: not started within its start deadline (0:00:10); recovered (started)" in (
        page.content.decode()
    )


# --- cost -------------------------------------------------------------------------------------


def _statements(fn) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        fn()
    return len(queries.captured_queries)


def _due_jobs(count: int, prefix: str, **options) -> None:
    api.schedule_many(
        {"task": TASK, "run_at": db_now() - timedelta(seconds=1), "name": f"{prefix}{i}",
         **options}
        for i in range(count)
    )


DEADLINES = {
    "start_deadline": 600,
    "max_runtime": 600,
    "finish_by": "23:59",
    "alert_after_failures": 3,
}


def test_the_claim_costs_the_same_statements_with_deadlines_configured():
    # Given 200 due jobs without deadlines, claimed
    _due_jobs(200, "plain")
    plain = _statements(lambda: claim_due_jobs("beat-1", 500))
    # And 200 with every deadline (none breached), claimed
    _due_jobs(200, "deadline", **DEADLINES)
    with_deadlines = _statements(lambda: claim_due_jobs("beat-1", 500))
    # Then the claim is the same statements
    assert with_deadlines == plain


def test_a_deadline_pass_reads_in_statements_not_per_job_that_is_fine():
    # Given jobs with every deadline and nothing breached, the pass costs some statements
    _due_jobs(10, "few", **DEADLINES)
    check("default")  # arms finish_by (once per job)
    few = _statements(lambda: check("default"))
    # When there are 20 times as many, it costs the same
    _due_jobs(200, "many", **DEADLINES)
    check("default")
    assert _statements(lambda: check("default")) == few


# --- the admin form and declared jobs ------------------------------------------------------------


def test_the_admin_form_takes_deadlines_and_names_a_bad_one(admin_client):
    from django.urls import reverse

    from tests.integration.test_admin import ADD, form_data, form_errors

    refused = admin_client.post(
        reverse(ADD), form_data(finish_by="25:00", skip_late="on", max_runtime="0")
    )
    errors = form_errors(refused)
    assert set(errors) >= {"finish_by", "skip_late", "max_runtime"}, errors
    assert not Job.objects.exists()
    saved = admin_client.post(
        reverse(ADD),
        form_data(start_deadline="300", skip_late="on", finish_by="09:00",
                  alert_after_failures="3"),
    )
    assert saved.status_code == 302, form_errors(saved)
    job = Job.objects.get()
    assert (job.start_deadline, job.skip_late, str(job.finish_by), job.alert_after_failures) == (
        timedelta(minutes=5), True, "09:00:00", 3
    )


def test_declared_jobs_carry_deadlines():
    from django.test import override_settings

    from schedapp.declared import sync_declared_jobs

    jobs = {"nightly": {"task": TASK, "cron": "0 3 * * *", "finish_by": "06:00",
                        "alert_after_failures": 2, "start_deadline": 60, "skip_late": True}}
    from schedapp.models import JobChange

    with override_settings(SCHEDAPP_JOBS=jobs):
        sync_declared_jobs()
        recorded = JobChange.objects.count()
        sync_declared_jobs()  # unchanged: writes nothing
        assert JobChange.objects.count() == recorded
    job = Job.objects.get(name="nightly")
    assert (str(job.finish_by), job.alert_after_failures, job.skip_late) == ("06:00:00", 2, True)
    assert job.start_deadline == MINUTE


def test_a_deadline_written_behind_the_apis_back_does_not_stop_the_pass(heard):
    from django.db import connection

    # Given a late job, and jobs whose deadlines (a million years) the API would refuse
    now = db_now()
    late = make("default", "late", start_deadline=timedelta(seconds=10),
                scheduled_for=now - MINUTE)
    odd = make("default", "odd", state=JobState.RUNNING, lease_expires_at=now + MINUTE, token=1)
    run("default", odd, status="running", started_at=now - MINUTE)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE schedapp_job SET start_deadline = '1000000 years', "
            "max_runtime = '1000000 years' WHERE id = %s",
            [odd.pk],
        )
    # When the pass runs, then the late job is found, and the odd one is within its deadlines
    assert [e.job_id for e in check("default").opened] == [late.pk]
    assert heard == [("late", "late", late.pk)]


@pytest.mark.django_db(transaction=True)
def test_finish_by_is_armed_with_one_update_per_deadline_instant_not_one_per_job():
    # Given 40 new jobs with a finish_by, in two zones (bulk scheduled: none armed yet)
    from datetime import time as clock

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from schedapp.policies import next_finish_by

    zones = ["UTC"] * 20 + ["Europe/Paris"] * 20
    jobs = [
        make("default", f"fb-{i}", timezone=z, finish_by=clock(23, 0))
        for i, z in enumerate(zones)
    ]
    # When the deadline pass arms them
    now = now_of("default")
    with CaptureQueriesContext(connection) as ctx:
        check("default")
    # Then each has its first deadline after now, written once per instant, not once per job
    for job in jobs:
        job.refresh_from_db()
        expected, _ = next_finish_by(clock(23, 0), job.timezone, now)
        assert job.finish_by_at == expected
    arming = [
        q for q in ctx.captured_queries
        if q["sql"].startswith("UPDATE") and "finish_by_at" in q["sql"]
    ]
    assert len(arming) == 2


def _main_table(sql: str) -> str:
    return sql.split(" FROM ", 1)[1].split()[0].strip('"') if " FROM " in sql else ""


def test_a_pass_with_no_open_breach_asks_once_to_clear():
    """Clearing asks one statement a breach kind (six) only when a breach is open: the
    common pass, nothing open, asks whether any is (issue 30: the pass beside a burst's
    claims). Before, six statements every pass."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _due_jobs(3, "fine", **DEADLINES)
    check("default")
    with CaptureQueriesContext(connection) as queries:
        check("default")
    on_breaches = [q["sql"] for q in queries if _main_table(q["sql"]) == "schedapp_breach"]
    assert len(on_breaches) == 1, on_breaches


@pytestmark_both
def test_late_is_found_whatever_the_mix_of_start_deadlines(alias, heard, monkeypatch):
    """The late look reads one range per distinct start deadline, then past
    ``LATE_DEADLINES`` of them one range for the rest: every job past its own deadline is
    late, none within it, however many distinct deadlines there are."""
    from schedapp import deadlines

    monkeypatch.setattr(deadlines, "LATE_DEADLINES", 3)
    now = now_of(alias)
    late, fine = [], []
    for i in range(10):  # deadlines 20 s, 40 s, ... 200 s; occurrences 90 s ago
        deadline = timedelta(seconds=20 * (i + 1))
        job = make(alias, f"j{i}", start_deadline=deadline,
                   scheduled_for=now - timedelta(seconds=90))
        (late if deadline < timedelta(seconds=90) else fine).append(job.pk)
    twin = make(alias, "twin", start_deadline=timedelta(seconds=20),
                scheduled_for=now - timedelta(seconds=90))
    recent = make(alias, "recent", start_deadline=timedelta(seconds=20),
                  scheduled_for=now - timedelta(seconds=5))
    found = check(alias)
    assert sorted(e.job_id for e in found.opened) == sorted([*late, twin.pk])
    assert recent.pk not in {e.job_id for e in found.opened}
    assert len(late) == 4 and len(fine) == 6


def _running(alias: str, name: str, runtime: timedelta | None, ran: timedelta, **fields) -> Job:
    """A running job (max runtime ``runtime``), claimed and its current run started ``ran``
    ago (as the claim stamps ``claimed_at``; a run starts after its claim)."""
    now = now_of(alias)
    values = {
        "state": JobState.RUNNING,
        "lease_expires_at": now + MINUTE,
        "token": 2,
        "claimed_at": now - ran,
        **fields,
    }
    job = make(alias, name, max_runtime=runtime, **values)
    run(alias, job, status="running", started_at=now - ran, dispatched_at=now - ran)
    return job


@pytestmark_both
def test_an_overrun_is_found_among_many_running_jobs_that_are_not_overrunning(alias, heard):
    """The overrun look reads the running jobs claimed longer ago than the smallest max
    runtime, not every running job: among 200 runs within their max runtime, the one past it
    is found, and none of those read but not overrunning (a job without a max runtime, a run
    of an older claim, a paused job's run, one a second short of its max runtime)."""
    now = now_of(alias)
    hour = timedelta(hours=1)
    values = {"task": TASK, "interval": 5 * MINUTE, "interval_anchor": now, "timezone": "UTC",
              "next_run_at": now, "scheduled_for": now, "state": JobState.RUNNING,
              "lease_expires_at": now + MINUTE, "token": 1, "max_runtime": hour,
              "claimed_at": now - MINUTE}
    fine = Job.objects.using(alias).bulk_create(
        [Job(name=f"fine-{i}", **values) for i in range(200)]
    )
    JobRun.objects.using(alias).bulk_create(
        [JobRun(job=j, token=1, scheduled_for=now, due_at=now, dispatched_at=now - MINUTE,
                task_id=f"schedapp:{j.pk}:1", status="running", started_at=now - MINUTE)
         for j in fine]
    )
    overrun = _running(alias, "overrun", hour, 2 * hour)
    # ... and runs started as long ago that are not overrunning
    _running(alias, "no-max-runtime", None, 2 * hour)
    older_claim = _running(alias, "older-claim", hour, MINUTE, token=3)
    run(alias, older_claim, token=2, status="running", started_at=now - 2 * hour)
    _running(alias, "paused", hour, 2 * hour, state=JobState.PAUSED)
    _running(alias, "almost", hour, hour - timedelta(seconds=1))
    # When the deadline pass runs, then the overrunning job alone is found, once
    assert [e.job_id for e in check(alias).opened] == [overrun.pk]
    assert check(alias).opened == []
    assert heard == [("overrunning", "overrunning", overrun.pk)]


@pytestmark_both
def test_overruns_are_found_with_two_different_max_runtimes(alias, heard):
    """One bound from the smallest max runtime holds the jobs of longer ones too: a run past
    a longer max runtime is found, one past the smaller but within its own is not."""
    short, long_ = timedelta(seconds=30), timedelta(minutes=10)
    short_over = _running(alias, "short-over", short, MINUTE)
    _running(alias, "short-fine", short, timedelta(seconds=10))
    long_over = _running(alias, "long-over", long_, 15 * MINUTE)
    _running(alias, "long-fine", long_, 5 * MINUTE)  # past 30 s, within its 10 minutes
    found = check(alias)
    assert sorted(e.job_id for e in found.opened) == sorted([short_over.pk, long_over.pk])
    details = {e.job_id: e.detail for e in found.opened}
    assert details[long_over.pk] == "running longer than its max runtime (0:10:00)"
    assert len(heard) == 2


@pytestmark_both
def test_an_overrun_is_found_when_the_job_was_rescheduled_during_its_run(alias, heard):
    """The bound is the claim's time, which only the claim writes: a job rescheduled while
    its run is in flight (the API moves its occurrence on, the run goes on under the old
    schedule) still has that run found overrunning."""
    now = now_of(alias)
    job = _running(alias, "moved", timedelta(minutes=10), 15 * MINUTE,
                   scheduled_for=now - 15 * MINUTE)
    Job.objects.using(alias).filter(pk=job.pk).update(
        scheduled_for=now + timedelta(hours=1), next_run_at=now + timedelta(hours=1)
    )
    assert [e.job_id for e in check(alias).opened] == [job.pk]
    assert heard == [("overrunning", "overrunning", job.pk)]


@pytestmark_both
def test_a_job_claimed_by_the_previous_release_is_looked_at_as_before(alias, heard):
    """A job claimed by a beat of the release before 0044 has no claimed_at (a rolling
    deploy): its overrun is found all the same."""
    job = _running(alias, "old-beat", timedelta(minutes=10), 15 * MINUTE, claimed_at=None)
    assert [e.job_id for e in check(alias).opened] == [job.pk]


@pytestmark_both
def test_the_look_reads_only_jobs_claimed_longer_ago_than_the_smallest_max_runtime(alias, heard):
    """What bounds the look: a job claimed a minute ago is not read, whatever its run row
    says (a run cannot start before its claim; this one is written so on purpose, to show
    that the claim's time, not the run's, decides what is read)."""
    now = now_of(alias)
    job = _running(alias, "recent-claim", timedelta(minutes=10), 15 * MINUTE,
                   claimed_at=now - MINUTE)
    assert check(alias).opened == []
    Job.objects.using(alias).filter(pk=job.pk).update(claimed_at=now - 11 * MINUTE)
    assert [e.job_id for e in check(alias).opened] == [job.pk]


@pytest.mark.django_db(transaction=True)
def test_the_claim_stamps_the_jobs_claimed_at_with_the_database_clock():
    from tests.claiming import claim_one

    before = db_now()
    job, run_ = claim_one()
    job.refresh_from_db()
    assert job.claimed_at is not None
    assert before <= job.claimed_at <= db_now()
    assert job.claimed_at == JobRun.objects.get(pk=run_.run_id).dispatched_at
