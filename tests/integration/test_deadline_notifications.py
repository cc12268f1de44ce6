"""Deadline breaches reach the notification channels (schedapp.deadlines -> schedapp.notify):
each breach queued in the transaction that records it, under its own incident, and its
recovery under the same one; a dead job is alerted where it is dead-lettered, so the deadline
pass's dead breach adds no second alert, only the recovery."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from schedapp.deadlines import check_deadlines
from schedapp.lease.after_run import notify_dead
from schedapp.models import Breach, Job, JobRun, JobState, Notification
from tests.integration.test_deadlines import make, now_of, run
from tests.integration.test_notifications import deliver_until, hook
from tests.receivers import webhook_receiver

pytestmark = pytest.mark.django_db(transaction=True)
MINUTE = timedelta(minutes=1)


def test_a_late_breach_is_alerted_once_and_its_recovery_follows_under_the_same_incident():
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            # Given a job whose claimed run waits for a worker past its start deadline
            now = now_of("default")
            job = make(
                "default",
                start_deadline=timedelta(seconds=10),
                state=JobState.RUNNING,
                scheduled_for=now - timedelta(seconds=30),
                lease_expires_at=now + MINUTE,
                token=1,
            )
            waiting = run("default", job, status="dispatched")
            # When the deadline pass runs twice
            check_deadlines()
            check_deadlines()
            # Then one alert is queued, under the breach's incident, and sent
            breach = Breach.objects.get(job=job)
            (alert,) = Notification.objects.all()
            assert (alert.kind, alert.incident, alert.job_id) == (
                "late",
                f"breach:{breach.pk}",
                job.pk,
            )
            deliver_until(lambda: len(receiver.accepted()) == 1)
            # When its run starts, the recovery is queued under the same incident and sent
            JobRun.objects.filter(pk=waiting.pk).update(status="running", started_at=now)
            check_deadlines()
            check_deadlines()
            recovered = Notification.objects.filter(kind="recovered")
            assert [n.incident for n in recovered] == [f"breach:{breach.pk}"]
            deliver_until(lambda: len(receiver.accepted()) == 2)
        assert [d.body["counts"] for d in receiver.accepted()] == [{"late": 1}, {"recovered": 1}]


def test_a_job_alerted_dead_where_it_died_gets_no_second_alert_and_recovers_once():
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            # Given a job dead-lettered (its completion queued the dead alert) and alerted
            job = make("default", state=JobState.DEAD, next_run_at=None, last_error="boom")
            notify_dead(job, job.scheduled_for, "boom")
            deliver_until(lambda: len(receiver.accepted()) == 1)
            # When the deadline pass records its dead breach: no second alert
            check_deadlines()
            assert Breach.objects.filter(job=job, kind="dead").count() == 1
            assert Notification.objects.filter(kind="dead").count() == 1
            # When it is requeued, the recovery clears the dead-lettering's incident, once
            Job.objects.filter(pk=job.pk).update(
                state=JobState.SCHEDULED, next_run_at=now_of("default") + MINUTE
            )
            check_deadlines()
            check_deadlines()
            recovered = Notification.objects.filter(kind="recovered")
            assert [n.incident for n in recovered] == [f"dead:{job.pk}"]
            deliver_until(lambda: len(receiver.accepted()) == 2)
        assert [d.body["counts"] for d in receiver.accepted()] == [{"dead": 1}, {"recovered": 1}]


def test_without_channels_a_breach_queues_nothing():
    now = now_of("default")
    job = make("default", start_deadline=timedelta(seconds=10), scheduled_for=now - MINUTE)
    assert [e.kind for e in check_deadlines().opened] == ["late"]
    assert Breach.objects.filter(job=job).exists() and not Notification.objects.exists()


def test_a_revoked_overrun_is_told_even_when_its_run_ended_before_the_alert_went_out():
    """revoke_overrun: schedapp itself ends the run, so the breach clears at the next pass,
    usually within the channel's group_wait. The alert must not be withdrawn as for an incident
    that cleared on its own: the team is told the run overran and was revoked (and that it
    ended), in one grouped message."""
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            # Given a run past its max runtime, its job asking for it to be revoked
            now = now_of("default")
            job = make(
                "default",
                max_runtime=timedelta(seconds=30),
                revoke_overrun=True,
                state=JobState.RUNNING,
                lease_expires_at=now + MINUTE,
                token=7,
            )
            running = run("default", job, status="running", started_at=now - MINUTE)
            assert check_deadlines().to_revoke == [f"schedapp:{job.pk}:7"]
            # When the revoked run ends before the channel sent the alert
            JobRun.objects.filter(pk=running.pk).update(status="cancelled", finished_at=now)
            Job.objects.filter(pk=job.pk).update(state=JobState.SCHEDULED)
            assert [e.kind for e in check_deadlines().recovered] == ["overrunning"]
            # Then the alert and its recovery both go out
            deliver_until(lambda: len(receiver.accepted()) == 1)
        (message,) = receiver.accepted()
        assert message.body["counts"] == {"overrunning": 1, "recovered": 1}
        assert "revoked (revoke_overrun)" in message.body["events"][0]["detail"]


def test_an_overrun_not_revoked_that_ends_before_its_alert_went_out_is_withdrawn():
    """Without revoke_overrun the run ended on its own: nothing to tell (the rule for every
    incident that clears within group_wait)."""
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            now = now_of("default")
            job = make(
                "default",
                max_runtime=timedelta(seconds=30),
                state=JobState.RUNNING,
                lease_expires_at=now + MINUTE,
                token=3,
            )
            running = run("default", job, status="running", started_at=now - MINUTE)
            check_deadlines()
            JobRun.objects.filter(pk=running.pk).update(status="succeeded", finished_at=now)
            Job.objects.filter(pk=job.pk).update(state=JobState.SCHEDULED)
            assert [e.kind for e in check_deadlines().recovered] == ["overrunning"]
            assert not Notification.objects.exists()
