"""A job's ``when_retries_exhausted`` (issue 29 item 1): "dead" (the default) sets the job aside
when an occurrence's retries are spent; "next_occurrence" records the failure and waits for the
next occurrence, as Celery beat does. Through every door a job is written by (the API, bulk
scheduling, the admin form, declarations, the importers) and both failure paths (a worker's
outcome, a reaped lease)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from celery.schedules import crontab
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

from schedapp import api, declared, importer, lease
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobRun, JobState, RunStatus
from tests.integration.test_admin import form_data

pytestmark = [pytest.mark.django_db]
TASK = "project.tasks.record"
CARRY_ON = "next_occurrence"


def fail_due_occurrence(job: Job, error: str = "card declined") -> lease.CompletionResult:
    """Make ``job`` due, claim it, admit its run and fail it, as a worker would."""
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (run,) = claim_due_jobs("beat-1", 10).runs
    admit_run(job.pk, run.token, "w1", f"a{run.token}")
    return complete_run(job.pk, run.token, lease.FAILED, error=error)


def test_a_failed_occurrence_with_no_retries_goes_on_to_the_next_one_and_is_counted():
    job = api.schedule(
        TASK, name="charge-cards", cron="* * * * *", max_retries=0, when_retries_exhausted=CARRY_ON
    )
    first = job.scheduled_for
    for n in (1, 2, 3):
        result = fail_due_occurrence(job, error=f"card declined {n}\ntraceback...")
        assert result.applied and not result.dead and result.carried_on
        job.refresh_from_db()
        assert job.state == JobState.SCHEDULED
        assert job.scheduled_for == first + timedelta(minutes=n)  # the next occurrence
        assert job.next_run_at == job.scheduled_for  # not retried after a backoff
        assert (job.retry_count, job.failed_occurrences) == (0, n)
        assert job.last_status == RunStatus.FAILED
        assert job.last_error.startswith(f"card declined {n}")
    assert (
        list(JobRun.objects.filter(job=job).values_list("status", flat=True))
        == [RunStatus.FAILED] * 3
    )


def test_a_retry_the_task_asks_for_is_run_then_its_final_failure_goes_on():
    # autoretry_for / self.retry on an imported job (max_retries=0): as under Celery's worker
    job = api.schedule(
        TASK, name="autoretry", interval=3600, max_retries=0, when_retries_exhausted=CARRY_ON
    )
    first = job.scheduled_for
    for n in (1, 2):
        Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
        (run,) = claim_due_jobs("beat-1", 10).runs
        admit_run(job.pk, run.token, "w1", f"a{run.token}")
        result = complete_run(
            job.pk, run.token, lease.FAILED, error="retry requested", retry_delay=timedelta(0)
        )
        assert result.applied and not result.carried_on
        job.refresh_from_db()
        assert (job.scheduled_for, job.retry_count, job.failed_occurrences) == (first, n, 0)
    # past the task's own max_retries Celery raises the failure itself: a plain failure
    assert fail_due_occurrence(job).carried_on
    job.refresh_from_db()
    assert (job.scheduled_for, job.retry_count) == (first + timedelta(hours=1), 0)
    assert list(
        JobRun.objects.filter(job=job).order_by("id").values_list("attempt", flat=True)
    ) == [1, 2, 3]


def test_by_default_a_job_with_no_retries_is_dead_at_its_first_failure():
    job = api.schedule(TASK, name="default", cron="* * * * *", max_retries=0)
    assert job.when_retries_exhausted == "dead"
    result = fail_due_occurrence(job)
    job.refresh_from_db()
    assert result.dead and job.state == JobState.DEAD and not result.carried_on
    assert job.failed_occurrences == 1


def test_retries_come_first_then_the_next_occurrence():
    job = api.schedule(
        TASK,
        name="retried",
        interval=3600,
        max_retries=1,
        retry_backoff=0,
        when_retries_exhausted=CARRY_ON,
    )
    first = job.scheduled_for
    fail_due_occurrence(job)
    job.refresh_from_db()
    assert (job.scheduled_for, job.retry_count, job.failed_occurrences) == (first, 1, 0)
    fail_due_occurrence(job)
    job.refresh_from_db()
    assert (job.state, job.scheduled_for) == (JobState.SCHEDULED, first + timedelta(hours=1))
    assert (job.retry_count, job.failed_occurrences) == (0, 1)


def test_a_one_off_with_the_carry_on_policy_has_no_next_occurrence_and_is_dead():
    job = api.schedule(
        TASK, name="once", run_at=db_now(), max_retries=0, when_retries_exhausted=CARRY_ON
    )
    result = fail_due_occurrence(job)
    job.refresh_from_db()
    assert result.dead and (job.state, job.failed_occurrences) == (JobState.DEAD, 1)


@pytest.mark.parametrize("careful", [False, True])
def test_a_lost_lease_with_its_retries_spent_goes_on_to_the_next_occurrence(careful):
    job = api.schedule(
        TASK, name="lost", interval=600, max_retries=0, when_retries_exhausted=CARRY_ON
    )
    first = job.scheduled_for
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (run,) = claim_due_jobs("beat-1", 10).runs
    admit_run(job.pk, run.token, "w1", "a1")
    # the worker dies mid-run: its lease runs out
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    if careful:  # the reaper one row at a time, as after a row failed the batch
        from schedapp.lease.reap import reap_each

        with transaction.atomic():
            reaped = reap_each(10, lambda: 0.5, None)
    else:
        reaped = lease.reap_expired_leases(10)
    job.refresh_from_db()
    assert (reaped.started, reaped.dead, reaped.carried_on) == (1, 0, 1)
    assert (job.state, job.scheduled_for) == (JobState.SCHEDULED, first + timedelta(minutes=10))
    assert (job.failed_occurrences, job.last_error) == (1, "lease expired while running")


# --- the field where jobs are written ---------------------------------------------------------


def test_a_bad_value_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as raised:
        api.schedule(TASK, interval=60, when_retries_exhausted="retry_forever")
    messages = raised.value.message_dict["when_retries_exhausted"]
    assert "'retry_forever' is not one of dead, next_occurrence" in messages[0]
    with pytest.raises(ValidationError) as raised:
        api.schedule_many([{"task": TASK, "interval": 60, "when_retries_exhausted": "sometimes"}])
    assert "0.when_retries_exhausted" in raised.value.message_dict
    assert Job.objects.count() == 0


def test_update_changes_the_policy():
    job = api.schedule(TASK, name="u", interval=60)
    api.update(job, when_retries_exhausted=CARRY_ON)
    assert Job.objects.get(pk=job.pk).when_retries_exhausted == CARRY_ON


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("copy_format", ["binary", "text"])
def test_schedule_many_writes_the_policy(copy_format, monkeypatch):
    from schedapp import bulk

    monkeypatch.setattr(bulk, "COPY_FORMAT", copy_format)
    count = api.schedule_many(
        [
            {"task": TASK, "name": "carry", "interval": 60, "when_retries_exhausted": CARRY_ON},
            {"task": TASK, "name": "plain", "interval": 60},
        ]
    )
    assert count == 2
    policies = dict(Job.objects.values_list("name", "when_retries_exhausted"))
    assert policies == {"carry": CARRY_ON, "plain": "dead"}
    assert set(Job.objects.values_list("failed_occurrences", flat=True)) == {0}


def test_the_admin_form_offers_and_saves_the_policy(admin_client):
    page = admin_client.get(reverse("admin:schedapp_job_add")).content.decode()
    assert 'name="when_retries_exhausted"' in page and 'value="next_occurrence"' in page
    data = form_data(name="from-admin", cron="*/5 * * * *", when_retries_exhausted=CARRY_ON)
    response = admin_client.post(reverse("admin:schedapp_job_add"), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Job.objects.get(name="from-admin").when_retries_exhausted == CARRY_ON


def test_a_declaration_takes_the_policy():
    jobs = {"declared": {"task": TASK, "interval": 60, "when_retries_exhausted": CARRY_ON}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        declared.sync_declared_jobs()
    assert Job.objects.get(name="declared").when_retries_exhausted == CARRY_ON


# --- the importers: Celery beat's behaviour unless told otherwise -----------------------------


def test_beat_schedule_entries_map_to_no_retry_and_carry_on():
    item = importer.map_beat_entry("m", {"task": TASK, "schedule": 60}, timezone="UTC")
    assert (item.spec["max_retries"], item.spec["when_retries_exhausted"]) == (0, CARRY_ON)


def test_celery_beat_schedule_imports_with_no_retry_and_carry_on_unless_told_otherwise():
    entries = {
        "charge-cards": {"task": TASK, "schedule": 60},
        "nightly": {"task": TASK, "schedule": crontab(minute=0, hour=2)},
    }
    out, err = StringIO(), StringIO()
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        call_command("schedapp_import", stdout=out, stderr=err)
    rows = set(Job.objects.values_list("name", "max_retries", "when_retries_exhausted"))
    assert rows == {("charge-cards", 0, CARRY_ON), ("nightly", 0, CARRY_ON)}

    Job.objects.all().delete()
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        call_command(
            "schedapp_import", "--retries", "3", "--on-exhausted", "dead", stdout=out, stderr=err
        )
    rows = set(Job.objects.values_list("name", "max_retries", "when_retries_exhausted"))
    assert rows == {("charge-cards", 3, "dead"), ("nightly", 3, "dead")}


def test_beat_schedule_declarations_have_celerys_failure_handling(monkeypatch):
    from project.celery import app

    monkeypatch.setitem(app.conf, "beat_schedule", {"ping": {"task": TASK, "schedule": 30}})
    declared.sync_declared_jobs()
    job = Job.objects.get(name="ping")
    assert (job.max_retries, job.when_retries_exhausted) == (0, CARRY_ON)


def test_django_celery_beat_tasks_import_with_no_retry_and_carry_on_unless_told_otherwise():
    dcb = pytest.importorskip("django_celery_beat.models")
    every = dcb.IntervalSchedule.objects.create(every=1, period=dcb.IntervalSchedule.MINUTES)
    dcb.PeriodicTask.objects.create(name="charge-cards", task=TASK, interval=every)
    out, err = StringIO(), StringIO()
    call_command("schedapp_import", "--from-django-celery-beat", stdout=out, stderr=err)
    job = Job.objects.get(name="charge-cards")
    assert (job.max_retries, job.when_retries_exhausted) == (0, CARRY_ON)

    call_command(
        "schedapp_import",
        "--from-django-celery-beat",
        "--update",
        "--retries",
        "2",
        "--on-exhausted",
        "dead",
        stdout=out,
        stderr=err,
    )
    job.refresh_from_db()
    assert (job.max_retries, job.when_retries_exhausted) == (2, "dead")


def test_a_carried_on_failure_is_counted_in_its_own_metric_not_in_the_dead_letters():
    from prometheus_client import REGISTRY

    from schedapp import metrics
    from schedapp.worker.completions import count_outcome

    def value(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    before = (value("schedapp_failed_occurrences_total"), value("schedapp_dead_letters_total"))
    job = api.schedule(
        TASK, name="counted", interval=60, max_retries=0, when_retries_exhausted=CARRY_ON
    )
    result = fail_due_occurrence(job)
    count_outcome(result, lease.FAILED)  # what a worker does with its outcome
    metrics.reaped(1, started=1, carried_on=2)
    after = (value("schedapp_failed_occurrences_total"), value("schedapp_dead_letters_total"))
    assert (after[0] - before[0], after[1] - before[1]) == (3, 0)
