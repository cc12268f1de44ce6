"""``schedapp_status`` and ``schedapp_prune`` (and the prune task schedapp runs on itself)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, Node, task_id_for
from schedapp.prune import parse_age, prune_runs
from schedapp.tasks import prune_runs as prune_task

pytestmark = [pytest.mark.django_db]


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def add_runs(
    job: Job,
    count: int,
    *,
    finished_ago: timedelta | None,
    status: str = "succeeded",
    first_token: int = 1,
) -> None:
    now = db_now()
    finished = now - finished_ago if finished_ago is not None else None
    JobRun.objects.bulk_create(
        JobRun(
            job=job,
            token=t,
            scheduled_for=now - timedelta(days=60),
            due_at=now,
            dispatched_at=now - timedelta(days=60),
            finished_at=finished,
            task_id=task_id_for(job.pk, t),
            status=status,
        )
        for t in range(first_token, first_token + count)
    )


# --- status ---------------------------------------------------------------------------------


def test_status_prints_states_backlog_oldest_due_beats_and_lag():
    now = db_now()
    api.schedule("project.tasks.record", run_at=now - timedelta(minutes=2), name="late")
    api.schedule("project.tasks.record", interval=60, name="later")
    dead = api.schedule("project.tasks.fail", interval=60, name="dead")
    Job.objects.filter(pk=dead.pk).update(state=JobState.DEAD)
    Node.objects.create(
        name="beat-x",
        kind="beat",
        hostname="h",
        pid=1,
        started_at=now,
        last_seen_at=now,
        stats={"claimed": 3},
    )
    job = Job.objects.get(name="later")
    JobRun.objects.create(
        job=job,
        token=1,
        scheduled_for=now,
        due_at=now - timedelta(seconds=1),
        dispatched_at=now,
        task_id="t",
        status="succeeded",
    )

    out, _err = run("schedapp_status")

    assert "scheduled" in out and "dead" in out
    assert "Due backlog        1" in out
    assert "Oldest due job     due since" in out
    assert "Dead letters       1" in out
    assert "beat-x" in out and "claimed=3" in out
    assert "1 runs, p50 1.0 s" in out

    data = json.loads(run("schedapp_status", "--json")[0])
    assert data["counts"]["scheduled"] == 2 and data["counts"]["dead"] == 1
    assert data["backlog"] == 1 and data["oldest_due_seconds"] >= 119
    assert [b["name"] for b in data["beats"]] == ["beat-x"]
    assert data["lag"]["max"] == 1.0


def test_status_check_fails_without_a_live_beat():
    with pytest.raises(SystemExit) as exited:
        run("schedapp_status", "--check")
    assert exited.value.code == 1
    now = db_now()
    Node.objects.create(name="b", kind="beat", started_at=now, last_seen_at=now)
    run("schedapp_status", "--check")  # healthy: no exit


def test_status_check_fails_when_a_due_job_waited_longer_than_max_wait():
    now = db_now()
    Node.objects.create(name="b", kind="beat", started_at=now, last_seen_at=now)
    api.schedule("project.tasks.record", run_at=now - timedelta(seconds=90), name="late")
    # 90 s is past the default --max-wait of 60 s
    with pytest.raises(SystemExit) as exited:
        run("schedapp_status", "--check")
    assert exited.value.code == 1
    data = json.loads(run("schedapp_status", "--json")[0])
    assert len(data["problems"]) == 1 and "the oldest due job has waited" in data["problems"][0]
    run("schedapp_status", "--check", "--max-wait", "300")  # a longer wait is accepted


def test_status_minutes_is_the_window_of_the_dispatch_lag():
    job = api.schedule("project.tasks.record", interval=60, name="j")
    now = db_now()
    JobRun.objects.create(
        job=job,
        token=1,
        scheduled_for=now - timedelta(minutes=8),
        due_at=now - timedelta(minutes=8, seconds=2),
        dispatched_at=now - timedelta(minutes=8),
        task_id="old",
        status="succeeded",
    )
    lag = json.loads(run("schedapp_status", "--json")[0])["lag"]
    assert lag["label"] == "last 5 min" and lag["runs"] == 0  # the default window
    lag = json.loads(run("schedapp_status", "--json", "--minutes", "10")[0])["lag"]
    assert lag["label"] == "last 10 min" and lag["runs"] == 1 and lag["max"] == 2.0


# --- prune ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("3600s", 3600), ("2w", 1209600)],
)
def test_ages(text, seconds):
    assert parse_age(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "d30", "30y", "-1d", "0s"])
def test_bad_ages(text):
    with pytest.raises(ValueError):
        parse_age(text)


def test_prune_deletes_old_finished_runs_in_batches_and_keeps_the_rest():
    job = api.schedule("project.tasks.record", interval=60, name="j")
    add_runs(job, 23, finished_ago=timedelta(days=40))  # old: deleted
    add_runs(job, 4, finished_ago=timedelta(days=2), first_token=100)  # recent: kept
    add_runs(job, 3, finished_ago=None, status="running", first_token=200)  # active: kept
    add_runs(job, 2, finished_ago=timedelta(days=90), status="dispatched", first_token=300)

    with CaptureQueriesContext(connection) as queries:
        result = prune_runs(timedelta(days=30), batch_size=10)

    assert result.deleted == 23 and result.batches == 3
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # one bounded DELETE per batch
    assert JobRun.objects.filter(status="succeeded").count() == 4
    assert JobRun.objects.filter(status__in=["running", "dispatched"]).count() == 5


def test_prune_command_and_dry_run():
    job = api.schedule("project.tasks.record", interval=60, name="j")
    add_runs(job, 7, finished_ago=timedelta(hours=13))
    out, _ = run("schedapp_prune", "--older-than", "12h", "--dry-run")
    assert out.startswith("would delete 7 run(s)")
    assert JobRun.objects.count() == 7
    out, _ = run("schedapp_prune", "--older-than", "14h")
    assert out.startswith("deleted 0 run(s)")
    out, _ = run("schedapp_prune", "--older-than", "12h", "--batch-size", "3")
    assert out.startswith("deleted 7 run(s)") and "(3 batch(es)" in out
    assert not JobRun.objects.exists()
    with pytest.raises(CommandError, match="not an age"):
        run("schedapp_prune", "--older-than", "soon")


def test_schedapp_can_prune_itself_as_a_job():
    # The task is registered, allowed by the demo's allowlist, and schedulable
    job = api.schedule(
        "schedapp.prune_runs",
        cron="0 3 * * *",
        name="schedapp-prune",
        kwargs={"older_than_seconds": 86400},
    )
    assert job.task == "schedapp.prune_runs"
    add_runs(job, 5, finished_ago=timedelta(days=2))
    add_runs(job, 2, finished_ago=timedelta(hours=1), first_token=10)
    result = prune_task.apply(kwargs=job.kwargs).get()
    assert result["deleted"] == 5
    assert JobRun.objects.count() == 2


def test_prune_max_batches_bounds_one_call_and_pause_spaces_the_batches():
    job = api.schedule("project.tasks.record", interval=60, name="j")
    add_runs(job, 7, finished_ago=timedelta(days=40))
    out, _ = run("schedapp_prune", "--older-than", "30d", "--batch-size", "3", "--max-batches", "2")
    assert out.startswith("deleted 6 run(s)") and "(2 batch(es)" in out
    assert JobRun.objects.count() == 1
    add_runs(job, 6, finished_ago=timedelta(days=40), first_token=100)
    started = time.monotonic()
    out, _ = run("schedapp_prune", "--older-than", "30d", "--batch-size", "3", "--pause", "0.4")
    assert out.startswith("deleted 7 run(s)") and "(3 batch(es)" in out
    assert time.monotonic() - started >= 0.8  # after each of the two full batches
    with pytest.raises(CommandError, match="--batch-size must be at least 1"):
        run("schedapp_prune", "--older-than", "30d", "--batch-size", "0")
