"""The door where it runs: inside Celery's own tracer, just before the task body, in the
process that executes the task. Built with Celery's ``build_tracer``, as a pool process
builds it, for tasks of the shapes Celery users write (a plain ``@app.task``, a custom base
class with a ``before_start`` of its own, a class-based task), against real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery, Task, group
from celery.app.trace import build_tracer
from celery.canvas import Signature
from celery.exceptions import Ignore, Reject
from celery.states import FAILURE, IGNORED, REJECTED, SUCCESS

from schedapp.db import db_now
from schedapp.dispatch import message_headers
from schedapp.message import HEADER_ADMISSION, RUN_HEADERS, parse_task_id
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.worker import install_door
from tests.claiming import claim_one

pytestmark = pytest.mark.django_db(transaction=True)

calls: list[tuple[str, str | None]] = []


def run_status(task_id: str) -> str | None:
    job, token = parse_task_id(task_id)  # type: ignore[misc]
    return JobRun.objects.filter(job_id=job, token=token).values_list("status", flat=True).first()


class Audited(Task):
    """A user's base class that defines ``before_start``: it must still run, after the door."""

    def before_start(self, task_id, args, kwargs):
        calls.append(("before_start", run_status(task_id)))


class ClassBased(Task):
    name = "door.class_based"

    def run(self):
        calls.append(("class_based", None))


@pytest.fixture
def app():
    app = Celery("door-test", set_as_current=False)

    @app.task(name="door.plain", shared=False)
    def plain():
        calls.append(("plain", None))

    @app.task(name="door.audited", base=Audited, shared=False)
    def audited():
        calls.append(("audited", None))

    @app.task(name="door.ignores", shared=False)
    def ignores():
        calls.append(("ignores", None))
        raise Ignore("nothing to do")

    @app.task(name="door.rejects", shared=False)
    def rejects(requeue=False):
        calls.append(("rejects", None))
        raise Reject("bad input", requeue=requeue)

    @app.task(name="door.replaces", bind=True, shared=False)
    def replaces(self, into="one"):
        calls.append(("replaces", None))
        if into == "chain":
            return self.replace(plain.si() | plain.si())
        if into == "group":
            return self.replace(group(plain.si(), plain.si()))
        return self.replace(plain.si())

    @app.task(name="door.retries", bind=True, shared=False)
    def retries(self):
        raise self.retry(exc=RuntimeError("again"))  # no countdown: default_retry_delay

    @app.task(name="door.retries_soon", bind=True, shared=False, default_retry_delay=7)
    def retries_soon(self):
        raise self.retry(exc=RuntimeError("again"))

    app.register_task(ClassBased())
    calls.clear()
    assert install_door(app) >= 6
    assert install_door(app) == 0  # once is enough
    return app


def trace(app, name: str, task_id: str, kwargs: dict | None = None, headers: dict | None = None):
    task = app.tasks[name]
    tracer = build_tracer(name, task, app.loader, "w1@host", app=app)
    request = {"hostname": "w1@host", "delivery_info": {}, **(headers or {})}
    return tracer(task_id, [], kwargs or {}, request)


def run_headers_of(run) -> dict:
    """schedapp's headers on the message a beat sends for ``run`` (those it sets)."""
    headers = message_headers(run, "beat@test")
    return {k: headers[k] for k in RUN_HEADERS if headers[k] is not None}


def delivered(run) -> dict:
    """What a worker's request holds of the message of ``run``: its id and schedapp's headers."""
    return {"id": run.task_id, **run_headers_of(run)}


@pytest.fixture
def sent(monkeypatch):
    """The signatures ``Task.replace`` sends, instead of sending them."""
    sigs: list[Signature] = []
    monkeypatch.setattr(Signature, "apply_async", lambda sig, *a, **kw: sigs.append(sig))
    return sigs


@pytest.mark.parametrize("name", ["door.plain", "door.audited", "door.class_based"])
def test_an_admitted_run_starts_and_its_body_runs(app, name):
    _, run = claim_one(lease_seconds=30)
    result = trace(app, name, run.task_id)
    assert result.info is None or result.info.state == SUCCESS
    body = name.split(".")[1]
    assert (body, None) in calls
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.worker) == (RunStatus.RUNNING, "w1@host")


def test_a_custom_before_start_runs_after_admission(app):
    _, run = claim_one(lease_seconds=30)
    trace(app, "door.audited", run.task_id)
    # the user's hook saw the run already admitted, then the body ran
    assert calls == [("before_start", RunStatus.RUNNING), ("audited", None)]


@pytest.mark.parametrize("name", ["door.plain", "door.audited", "door.class_based"])
def test_a_refused_run_never_reaches_the_body_nor_the_users_before_start(app, name):
    job, run = claim_one(lease_seconds=30, max_retries=0)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    result = trace(app, name, run.task_id)
    # Celery's own path for "do not run this": the message is acknowledged, nothing ran
    assert result.info.state == IGNORED
    assert calls == []
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SKIPPED


def test_a_second_delivery_of_an_admitted_message_does_not_run(app):
    _, run = claim_one(lease_seconds=30)
    trace(app, "door.plain", run.task_id)
    calls.clear()
    result = trace(app, "door.plain", run.task_id)  # redelivered (e.g. a visibility timeout)
    assert result.info.state == IGNORED and calls == []
    # the door's refusal records nothing: the first delivery's run goes on
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.RUNNING


def test_a_task_raising_ignore_drops_its_occurrence_instead_of_leaving_its_run_open(app):
    # Given an admitted recurring run whose task raises Celery's Ignore (no other signal)
    job, run = claim_one(interval=60, lease_seconds=30)
    result = trace(app, "door.ignores", run.task_id)
    assert result.info.state == IGNORED and calls == [("ignores", None)]
    # Then the run is closed skipped and the job goes on with its next occurrence, no
    # attempt counted (it stayed running until its lease expired, then ran again as lost)
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.error) == (RunStatus.SKIPPED, "ignored by the task: Ignore: nothing to do")
    job.refresh_from_db()
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 0)
    assert job.scheduled_for == run.scheduled_for + timedelta(seconds=60)


@pytest.mark.parametrize("requeue", [False, True])
def test_a_task_raising_reject_fails_its_attempt(app, requeue):
    job, run = claim_one(lease_seconds=30, max_retries=1)
    result = trace(app, "door.rejects", run.task_id, {"requeue": requeue})
    assert result.info.state == REJECTED
    # Then the attempt failed with the reason and follows the job's retry policy
    r = JobRun.objects.get(pk=run.run_id)
    how = " (requeued)" if requeue else ""
    assert (r.status, r.error) == (RunStatus.FAILED, f"rejected by the task{how}: bad input")
    job.refresh_from_db()
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 1)


@pytest.mark.parametrize(("name", "delay"), [("door.retries", 180), ("door.retries_soon", 7)])
def test_a_retry_without_a_countdown_waits_the_tasks_default_retry_delay(app, sent, name, delay):
    # Given an admitted run whose task calls self.retry(exc=...) with no countdown, and a job
    # backoff (1,000 s) that is neither Celery's default delay (180 s) nor the task's own
    job, run = claim_one(lease_seconds=30, retry_backoff=1000)
    trace(app, name, run.task_id, headers=delivered(run))
    # Then the attempt failed, and the occurrence waits Celery's delay, as under Celery
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.error) == (RunStatus.FAILED, "retry requested: RuntimeError: again")
    job.refresh_from_db()
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 1)
    waits = (job.next_run_at - db_now()).total_seconds()
    assert delay - 5 < waits <= delay, waits
    assert len(sent) == 1  # Celery's own retry message (refused at the door when it comes)


def test_tasks_schedapp_did_not_dispatch_pass_straight_through(app):
    result = trace(app, "door.plain", "9b2e6c2e-3c1f-4d39-a0e4-4d0a1c7d1f00")
    assert result.info is None or result.info.state == SUCCESS
    assert calls == [("plain", None)]


def test_a_task_replaced_by_one_task_hands_its_run_over_to_it(app, sent):
    # Given an admitted run, its lease near its end, whose task replaces itself
    job, run = claim_one(lease_seconds=30, max_retries=0)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() + timedelta(seconds=2))
    result = trace(app, "door.replaces", run.task_id, headers=delivered(run))
    assert result.info.state == IGNORED
    # Then the replacement is sent with the run's task id, headers and admission, the run
    # stays running (not skipped) and its lease is whole again for the replacement's way
    (sig,) = sent
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, sig.id, sig.name) == (RunStatus.RUNNING, run.task_id, "door.plain")
    headers = sig.options["headers"]
    assert headers == {**run_headers_of(run), HEADER_ADMISSION: r.admission}
    job.refresh_from_db()
    assert job.lease_expires_at > db_now() + timedelta(seconds=25)
    # ... its door admits it as the same run, and its outcome is the run's
    calls.clear()
    trace(app, "door.plain", sig.id, headers={"id": sig.id, **headers})
    assert calls == [("plain", None)]
    r.refresh_from_db()
    assert r.status == RunStatus.SUCCEEDED
    assert r.admission not in ("", headers[HEADER_ADMISSION])  # taken over under its own
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_replacements_message_delivered_again_while_it_runs_is_refused(app, sent):
    """As any message delivered again (RabbitMQ redelivers an unacknowledged message when the
    worker's broker connection drops): before, the copy carried the same admission and was
    admitted again, a second execution while the first ran."""
    from types import SimpleNamespace

    from schedapp.worker import Refused, hooks

    _, run = claim_one(lease_seconds=30)
    trace(app, "door.replaces", run.task_id, headers=delivered(run))
    (sig,) = sent
    message = {"id": sig.id, **sig.options["headers"]}
    task = app.tasks["door.plain"]
    for copy in ("first", "again"):  # each delivery is a request of its own
        task.request_stack.push(SimpleNamespace(hostname=f"{copy}@host", **message))
        try:
            if copy == "first":
                hooks.door.admit(task, sig.id)  # admitted: its body would run now
            else:
                with pytest.raises(Refused, match="duplicate delivery"):
                    hooks.door.admit(task, sig.id)
        finally:
            task.request_stack.pop()
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.worker) == (RunStatus.RUNNING, "first@host")


def test_another_delivery_of_a_replaced_run_is_still_refused(app, sent):
    _, run = claim_one(lease_seconds=30)
    trace(app, "door.replaces", run.task_id, headers=delivered(run))
    calls.clear()
    result = trace(app, "door.plain", run.task_id, headers=delivered(run))  # no admission
    assert result.info.state == IGNORED and calls == []


@pytest.mark.parametrize("into", ["chain", "group"])
def test_a_task_replaced_by_a_chain_or_a_group_fails_its_run_and_sends_nothing(app, sent, into):
    job, run = claim_one(lease_seconds=30, max_retries=0)
    result = trace(app, "door.replaces", run.task_id, {"into": into}, headers=delivered(run))
    assert result.info.state == FAILURE and sent == []
    r = JobRun.objects.get(pk=run.run_id)
    assert r.status == RunStatus.FAILED
    assert r.error.startswith(
        f"ReplaceNotSupported: a task of a schedapp job can be replaced "
        f"by the signature of one task, not by a {into}"
    )
    job.refresh_from_db()
    assert job.state == JobState.DEAD
