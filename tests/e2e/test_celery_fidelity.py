"""Switching ``-S`` changes nothing a Celery team relies on: ``beat_schedule`` entries (and
``add_periodic_task``) run, and headers a ``before_task_publish`` receiver adds (tracing)
reach the task, on a real beat and worker, over Redis and over RabbitMQ."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from project.models import Execution
from schedapp.models import Job, JobSource
from schedapp.testing.fleet import RABBITMQ, fleet_for, wait_until
from tests import APP, ROOT, SETTINGS

pytestmark = [pytest.mark.e2e]


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_beat_schedule_entries_run_with_the_headers_publish_receivers_add(
    broker, transactional_db, broker_url, tmp_path
):
    from django.db import connection

    url = broker_url if broker == "redis" else RABBITMQ
    queue = f"fidelity-{uuid.uuid4().hex[:8]}"  # the broker is shared: a queue of our own
    schedule = {
        "traced-every-2s": {
            "task": "project.tasks.traced",
            "schedule": 2.0,
            "kwargs": {"label": "beat"},
        }
    }
    env = {
        "PROJECT_DEFAULT_QUEUE": queue,
        "PROJECT_BEAT_SCHEDULE": json.dumps(schedule),
        "PROJECT_PERIODIC_TASK": "added,project.tasks.traced,3",
        "PROJECT_TRACE_HEADER": "trace",
    }
    with fleet_for(
        tmp_path, connection.settings_dict, url, env, app=APP, cwd=ROOT, settings_module=SETTINGS
    ) as fleet:
        try:
            # Given a beat switched with -S and nothing else: a CELERY_BEAT_SCHEDULE entry,
            # an add_periodic_task entry and a before_task_publish receiver in the project
            beat = fleet.beat()
            fleet.worker(concurrency=1, extra_args=["-Q", queue])
            # Then both entries run on the worker, each with the receiver's header
            for label in ("beat", "added"):
                wait_until(
                    lambda label=label: Execution.objects.filter(
                        label__startswith=f"{label}:trace-schedapp:"
                    ).exists(),
                    timeout=90,
                    message=f"{label} ran with its trace header",
                )
            execution = Execution.objects.filter(label__startswith="beat:").first()
            assert execution.label == f"beat:trace-{execution.task_id}"
            job = Job.objects.get(name="traced-every-2s")
            assert job.source == JobSource.DECLARED
            assert "Scheduler: Sending due task traced-every-2s (project.tasks.traced)" in (
                beat.log()
            )
        except BaseException:
            print(fleet.logs())
            raise


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_job_with_no_queue_is_published_with_its_tasks_own_options(
    broker, transactional_db, broker_url, tmp_path
):
    from django.db import connection

    from schedapp import api
    from schedapp.db import db_now

    url = broker_url if broker == "redis" else RABBITMQ
    with fleet_for(
        tmp_path, connection.settings_dict, url, app=APP, cwd=ROOT, settings_module=SETTINGS
    ) as fleet:
        try:
            # Given @shared_task(queue="slowq", priority=7, expires=30, time_limit=60,
            # soft_time_limit=50) and a worker that consumes only that queue
            fleet.beat()
            fleet.worker(concurrency=1, extra_args=["-Q", "slowq"])
            # When a job leaves its queue empty (the README: "the task's own routing")
            api.schedule("project.tasks.routed", run_at=db_now(), kwargs={"label": "r"})
            # Then it runs there, with the task's priority, expiry and time limit, as
            # apply_async would have sent it
            wait_until(
                lambda: Execution.objects.filter(label__startswith="r|").exists(),
                timeout=90,
                message="the routed task ran on the queue its task names",
            )
            label = Execution.objects.get(label__startswith="r|").label
            assert label.split("|")[1:] == ["slowq", "7", "True", "[60, 50]"], label
        except BaseException:
            print(fleet.logs())
            raise


def test_an_occurrence_whose_message_expired_unseen_is_dropped_not_sent_again(fleet_on_each_broker):
    from schedapp import api
    from schedapp.db import db_now
    from schedapp.models import JobRun, JobState, RunStatus

    fleet = fleet_on_each_broker
    # Given a one-off whose message expires 1 s after it is sent (RabbitMQ drops it unseen;
    # Redis keeps it for a worker to discard), sent while no worker runs, its lease 2 s
    fleet.beat()
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "expiring"},
        run_at=db_now(),
        lease_seconds=2,
        max_retries=0,
        message_options={"expires": 1},
        name="expiring",
    )
    # When its lease expires unstarted and the beat reaps it, and only then a worker starts
    wait_until(
        lambda: JobRun.objects.filter(job=job).exclude(status=RunStatus.DISPATCHED).exists(),
        timeout=60,
        message="the reap",
    )
    fleet.worker(concurrency=1)
    final = (JobState.CANCELLED, JobState.SUCCEEDED, JobState.DEAD)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state in final, timeout=60, message="the job ended"
    )
    time.sleep(2)
    # Then the occurrence was dropped as Celery beat drops an expired message: never sent
    # again with a fresh expiry, never run, the one-off cancelled
    assert not Execution.objects.filter(label="expiring").exists()
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    runs = list(JobRun.objects.filter(job=job).values_list("status", "error"))
    assert runs == [(RunStatus.SKIPPED, "expired before a worker started it")]
