"""Notifications (issue 30 item 2): the outbox is written in the event's transaction, a
channel's events go out grouped as one message, one alert per incident, a webhook signed
and retried with backoff against a real local HTTP server, email through Django's SMTP
backend to a real local SMTP sink, and two delivery loops never send one event twice."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from schedapp import api, declared, lease, notify
from schedapp.checks import check_notifications
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobChange, Notification, NotificationChannel
from schedapp.notify.delivery import DeliveryLoop, deliver_channel, deliver_once
from schedapp.notify.outbox import configured_channels
from tests.integration.test_admin import form_data
from tests.receivers import SECRET, smtp_sink, webhook_receiver

pytestmark = pytest.mark.django_db(transaction=True)
TASK = "project.tasks.record"


def hook(url: str, **options: Any) -> dict[str, Any]:
    return {
        "type": "webhook",
        "url": url,
        "secret": SECRET,
        "timeout": 2,
        "group_wait": 0,
        "group_interval": 0,
        "backoff": 0.2,
        "max_attempts": 3,
        **options,
    }


def a_job(name: str = "nightly", **options: Any) -> Job:
    return api.schedule(TASK, name=name, interval=3600, **options)


def deliver_until(check: Any, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "not delivered in time"
        deliver_once()
        time.sleep(0.05)


def test_the_outbox_row_exists_only_if_the_events_transaction_commits():
    with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook("http://127.0.0.1:9/x")}):
        job = a_job()
        with pytest.raises(RuntimeError), transaction.atomic():
            assert notify.enqueue("dead", job, incident="dead:1") == ["ops"]
            raise RuntimeError("the event's transaction rolls back")
        assert not Notification.objects.exists()
        with transaction.atomic():
            notify.enqueue("dead", job, incident="dead:1", detail="boom")
        (row,) = Notification.objects.all()
        assert (row.channel, row.kind, row.job_name, row.detail) == (
            "ops",
            "dead",
            "nightly",
            "boom",
        )


def test_a_job_dead_lettered_by_a_failure_past_its_retries_queues_one_dead_event():
    with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook("http://127.0.0.1:9/x")}):
        job = a_job(max_retries=1, tags=["billing"])
        for _attempt in (1, 2):
            Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
            (run,) = claim_due_jobs("beat-1", 10).runs
            admit_run(job.pk, run.token, "w1", f"a{run.token}")
            result = complete_run(job.pk, run.token, lease.FAILED, error="card declined\ntb")
        assert result.dead
        (row,) = Notification.objects.all()
        assert (row.kind, row.job_id, row.tags, row.detail) == (
            "dead",
            job.pk,
            ["billing"],
            "card declined",
        )
        assert row.incident == f"dead:{job.pk}"


def test_a_lease_reaped_with_its_retries_spent_queues_dead_and_one_carried_on_does_not():
    with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook("http://127.0.0.1:9/x")}):
        dies = a_job("dies", max_retries=0)
        a_job("carries", max_retries=0, when_retries_exhausted="next_occurrence")
        Job.objects.update(next_run_at=db_now() - timedelta(seconds=1))
        for run in claim_due_jobs("beat-1", 10).runs:
            admit_run(run.job_id, run.token, "w1", f"a{run.job_id}")
        # the worker dies mid-run: its leases run out
        Job.objects.update(lease_expires_at=db_now() - timedelta(seconds=1))
        reaped = lease.reap_expired_leases(10)
        assert (reaped.dead, reaped.carried_on) == (1, 1)
        (row,) = Notification.objects.all()
        assert (row.kind, row.job_id) == ("dead", dies.pk)
        assert row.detail == "lease expired while running"


def test_channels_route_by_kind_and_tag_and_bad_settings_name_the_channel_and_key():
    channels = {
        "billing-mail": {"type": "email", "to": ["b@example.com"], "tags": ["billing"]},
        "pager": hook("http://127.0.0.1:9/x", kinds=["dead"]),
    }
    with override_settings(SCHEDAPP_NOTIFICATIONS=channels):
        assert check_notifications() == []
        billing, other = a_job("a", tags=["billing"]), a_job("b", tags=["web"])
        assert notify.enqueue("late", billing) == ["billing-mail"]
        assert notify.enqueue("late", other) == []
        assert notify.enqueue("dead", other) == ["pager"]
    bad = {"pager": {"type": "webhook", "url": "ftp://x", "secret": "short", "kinds": ["lat"]}}
    with override_settings(SCHEDAPP_NOTIFICATIONS=bad):
        errors = check_notifications()
        assert {e.id for e in errors} == {"schedapp.E040"}
        text = " ".join(e.msg for e in errors)
        assert "SCHEDAPP_NOTIFICATIONS['pager']['url']" in text
        assert "['secret']" in text and "['kinds']: lat" in text
        assert configured_channels() == {}


def test_many_events_go_out_as_one_message_with_exact_counts_per_kind():
    with webhook_receiver() as receiver:
        channel = hook(receiver.url, group_wait=60)
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": channel}):
            jobs = [a_job(f"job-{n:02}") for n in range(30)]
            kinds = ["late"] * 17 + ["failing"] * 9 + ["dead"] * 4
            for job, kind in zip(jobs, kinds, strict=True):
                notify.enqueue(kind, job, incident=f"{kind}:{job.pk}")
            assert deliver_once() > 0  # still within the group's wait: nothing sent
            assert receiver.received == []
            Notification.objects.update(created_at=db_now() - timedelta(seconds=61))
            deliver_once()
        (message,) = receiver.received
        assert message.signed and message.status == 200
        body = message.body
        assert body["counts"] == {"late": 17, "failing": 9, "dead": 4}
        assert body["total"] == 30 and body["more"] == 10 and len(body["events"]) == 20
        assert sorted(body["event_ids"]) == sorted(
            Notification.objects.values_list("id", flat=True)
        )
        assert not Notification.objects.filter(sent_at=None).exists()


def test_one_alert_per_incident_and_a_recovery_before_it_was_sent_withdraws_it():
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            job = a_job()
            # Given an incident alerted twice while unsent: one row (the unique index)
            notify.enqueue("late", job, incident="late:x")
            notify.enqueue("late", job, incident="late:x")
            assert Notification.objects.count() == 1
            # When it recovers before the alert went out: nothing to say, nothing queued
            assert notify.enqueue("recovered", job, incident="late:x") == []
            assert not Notification.objects.exists()
            # Given an alert that was sent, its recovery is queued and sent (once)
            notify.enqueue("late", job, incident="late:y")
            deliver_until(lambda: len(receiver.accepted()) == 1)
            assert notify.enqueue("recovered", job, incident="late:y") == ["ops"]
            assert notify.enqueue("recovered", job, incident="late:y") == []
            deliver_until(lambda: len(receiver.accepted()) == 2)
        kinds = [d.body["counts"] for d in receiver.accepted()]
        assert kinds == [{"late": 1}, {"recovered": 1}]


def test_a_second_enqueue_racing_on_another_connection_adds_nothing():
    with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook("http://127.0.0.1:9/x")}):
        job = a_job()
        inside = threading.Event()

        def other() -> None:
            with transaction.atomic():
                notify.enqueue("failing", job, incident="failing:1")
                inside.set()
                time.sleep(0.3)
            connections.close_all()

        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(5)
        with transaction.atomic():  # waits for the other's commit on the unique index
            notify.enqueue("failing", job, incident="failing:1")
        thread.join()
        assert Notification.objects.count() == 1


def test_a_webhook_answering_500_is_retried_after_a_backoff_then_sent():
    with webhook_receiver(statuses=[500, 500]) as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url, backoff=0.3)}):
            notify.enqueue("dead", a_job())
            deliver_until(lambda: receiver.accepted())
        first, second, third = receiver.received
        assert [d.status for d in receiver.received] == [500, 500, 200]
        assert all(d.signed for d in receiver.received)
        # waits of 0.3 s then 0.6 s (counted from each attempt's start in the database's
        # clock; the receiver sees them give or take the time an attempt takes to arrive)
        assert second.at - first.at >= 0.25 and third.at - second.at >= 0.55
        (row,) = Notification.objects.all()
        assert row.sent_at is not None and row.attempts == 3 and row.failed_at is None
        state = NotificationChannel.objects.get(name="ops")
        assert (state.failures, state.retry_at) == (0, None)


def test_a_webhook_always_answering_500_fails_after_its_max_attempts(caplog):
    with webhook_receiver(statuses=[500] * 10) as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url, backoff=0.1)}):
            notify.enqueue("dead", a_job())
            deliver_until(lambda: Notification.objects.filter(failed_at__isnull=False).exists())
            for _ in range(5):  # nothing more is tried
                deliver_once()
        assert [d.status for d in receiver.received] == [500, 500, 500]
        (row,) = Notification.objects.all()
        assert row.attempts == 3 and row.sent_at is None
        assert row.last_error.startswith("HTTP 500 from http://127.0.0.1:")
        assert "failed after 3 attempt(s)" in caplog.text


def test_a_forged_or_unreachable_webhook_is_a_failure_not_a_send():
    with webhook_receiver(secret="another-secret-entirely") as receiver:  # signature mismatch
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url, max_attempts=1)}):
            notify.enqueue("dead", a_job())
            deliver_once()
        assert [d.status for d in receiver.received] == [401]
        assert Notification.objects.get().failed_at is not None


def test_email_goes_through_djangos_smtp_backend_to_a_real_smtp_sink():
    with smtp_sink() as sink:
        channel = {
            "type": "email",
            "to": ["ops@example.com"],
            "from": "schedapp@example.com",
            "group_wait": 0,
        }
        with override_settings(
            SCHEDAPP_NOTIFICATIONS={"mail": channel},
            EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
            EMAIL_HOST=sink.host,
            EMAIL_PORT=sink.port,
        ):
            notify.enqueue("dead", a_job("charge-cards"), detail="card declined")
            notify.enqueue("late", a_job("report"))
            deliver_until(lambda: sink.messages)
        (mail,) = sink.messages
        assert mail["To"] == "ops@example.com" and mail["From"] == "schedapp@example.com"
        assert mail["Subject"] == "[schedapp] 1 late, 1 dead: charge-cards and 1 more jobs"
        text = mail.get_payload()
        assert "- dead: charge-cards" in text and "card declined" in text
        assert Notification.objects.filter(sent_at=None).count() == 0


def test_two_delivery_loops_on_two_connections_never_send_one_event_twice():
    with webhook_receiver(delay=0.05) as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            loops = [DeliveryLoop(), DeliveryLoop()]
            for loop in loops:
                loop.start()
            try:
                jobs = [a_job(f"job-{n}") for n in range(5)]
                for n in range(200):
                    with transaction.atomic():
                        notify.enqueue("failing", jobs[n % 5], detail=str(n))
                end = time.monotonic() + 20
                while Notification.objects.filter(sent_at=None).exists():
                    assert time.monotonic() < end
                    time.sleep(0.1)
            finally:
                for loop in loops:
                    loop.stop()
        ids = receiver.event_ids()
        assert len(ids) == len(set(ids)) == 200
        assert [d.status for d in receiver.received] == [200] * len(receiver.received)


def test_a_channel_locked_by_one_loop_is_skipped_by_another_without_waiting():
    with webhook_receiver(delay=1.0) as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            notify.enqueue("dead", a_job())
            channel = configured_channels()["ops"]
            first = threading.Thread(
                target=lambda: (deliver_channel(channel), connections.close_all())
            )
            first.start()
            # the first loop is sending (the receiver answers after a second)
            end = time.monotonic() + 5
            while not _channel_locked():
                assert time.monotonic() < end and not receiver.received, "the channel not locked"
                time.sleep(0.01)
            started = time.monotonic()
            assert deliver_channel(channel) is None  # another loop has the channel
            assert time.monotonic() - started < 0.5
            first.join()
        assert len(receiver.received) == 1


def _channel_locked() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE c.relname = 'schedapp_notificationchannel' AND l.mode = 'RowShareLock'"
        )
        return cursor.fetchone()[0] > 0


def test_the_command_delivers_once_and_refuses_bad_settings():
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            notify.enqueue("dead", a_job())
            call_command("schedapp_notify", "--once")
        assert len(receiver.accepted()) == 1
    from django.core.management.base import CommandError

    with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": {"type": "pager"}}):
        with pytest.raises(CommandError, match=r"\['type'\] must be one of email, webhook"):
            call_command("schedapp_notify", "--once")


@pytest.mark.exhaustive  # at scale; test_many_events_go_out_as_one_message_... keeps the rule
def test_a_storm_of_500_events_makes_few_messages_and_lists_or_counts_every_event():
    """The bound: one message per channel per group interval (the first after group_wait).
    With the defaults (10 s, 60 s) 500 events in one minute are two messages; here the
    intervals are shortened (0.25 s, 1 s) and the events spread over about two seconds."""
    with webhook_receiver() as receiver:
        channel = hook(receiver.url, group_wait=0.25, group_interval=1)
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": channel}):
            loop = DeliveryLoop()
            loop.start()
            try:
                jobs = [a_job(f"job-{n:03}") for n in range(50)]
                kinds = ("late", "overrunning", "failing", "dead")
                for n in range(500):
                    with transaction.atomic():
                        notify.enqueue(kinds[n % 4], jobs[n % 50], incident=f"e{n}")
                    time.sleep(0.004)
                end = time.monotonic() + 30
                while Notification.objects.filter(sent_at=None).exists():
                    assert time.monotonic() < end
                    time.sleep(0.1)
            finally:
                loop.stop()
        messages = receiver.accepted()
        # every event in exactly one message, and each message's counts exact
        ids = receiver.event_ids()
        assert sorted(ids) == sorted(Notification.objects.values_list("id", flat=True))
        assert len(ids) == 500
        for m in messages:
            assert sum(m.body["counts"].values()) == m.body["total"] == len(m.body["event_ids"])
            assert len(m.body["events"]) == min(m.body["total"], 20)
        totals = {k: sum(m.body["counts"].get(k, 0) for m in messages) for k in kinds}
        assert totals == dict.fromkeys(kinds, 125)
        # the bound, in the database's clock: messages at least a group interval apart
        sent = sorted(set(Notification.objects.values_list("sent_at", flat=True)))
        assert len(sent) == len(messages)
        assert all(b - a >= timedelta(seconds=1) for a, b in pairwise(sent))
        first = Notification.objects.order_by("created_at").values_list("created_at", flat=True)[0]
        span = (sent[-1] - first).total_seconds()
        assert len(messages) <= 1 + span / 1


def test_the_admin_lists_notifications_read_only_with_failed_ones_and_their_error(admin_client):
    with webhook_receiver(statuses=[500]) as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url, max_attempts=1)}):
            notify.enqueue("dead", a_job("charge-cards"))
            deliver_once()
    url = reverse("admin:schedapp_notification_changelist")
    html = admin_client.get(url + "?delivery=failed").content.decode()
    assert "charge-cards" in html and "HTTP 500 from" in html and "failed " in html
    assert "charge-cards" not in admin_client.get(url + "?delivery=pending").content.decode()
    row = Notification.objects.get()
    assert admin_client.get(reverse("admin:schedapp_notification_add")).status_code == 403
    change = reverse("admin:schedapp_notification_change", args=[row.pk])
    assert admin_client.post(change, {"channel": "x"}).status_code == 403


# --- a job's own channels (Job.notify) ------------------------------------------------------

CHANNELS = {
    "team-eu": {"type": "email", "to": ["eu@example.com"], "tags": ["eu"]},
    "pager": {"type": "email", "to": ["p@example.com"], "tags": [], "kinds": ["dead"]},
}


@override_settings(SCHEDAPP_NOTIFICATIONS=CHANNELS)
def test_a_job_naming_a_channel_gets_it_whatever_its_tag_filter_and_kinds_still_apply():
    job = a_job("charge-cards", notify=["pager", "pager"])
    assert job.notify == ["pager"]
    assert notify.enqueue("dead", job) == ["pager"]
    assert notify.enqueue("late", job) == []  # the pager takes dead only
    assert notify.enqueue("dead", a_job("other")) == []  # a channel with tags=[]: named only
    # an unknown channel is refused, naming the field and the channels there are
    with pytest.raises(ValidationError) as refused:
        api.update(job, notify=["pagr"])
    (message,) = refused.value.message_dict["notify"]
    assert (
        message == "'pagr' is not a channel of SCHEDAPP_NOTIFICATIONS (configured: pager, team-eu)."
    )
    with pytest.raises(ValidationError) as refused:
        api.schedule(TASK, name="x", interval=60, notify="pager")
    assert "must be a list of channel names" in refused.value.message_dict["notify"][0]
    # the audit trail has the change like any field
    api.update(job, notify=["team-eu", "pager"])
    change = JobChange.objects.filter(job_id=job.pk).order_by("-id").first()
    assert change.changes["notify"] == [["pager"], ["pager", "team-eu"]]


@override_settings(SCHEDAPP_NOTIFICATIONS=CHANNELS)
def test_declared_jobs_and_the_admin_form_take_a_jobs_channels(admin_client):
    jobs = {"nightly": {"task": TASK, "cron": "0 2 * * *", "notify": ["pager"]}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        declared.sync_declared_jobs()
    assert Job.objects.get(name="nightly").notify == ["pager"]
    job = a_job("edit-me")
    url = reverse("admin:schedapp_job_change", args=[job.pk])
    data = form_data(
        name="edit-me", task=TASK, kwargs="{}", cron="", interval="3600", timezone="UTC"
    )
    data["notify"] = "team-eu pager"
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert job.notify == ["pager", "team-eu"]
    data["notify"] = "nowhere"
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "not a channel" in response.context["adminform"].form.errors["notify"][0]


def test_nothing_configured_costs_the_dead_path_no_statement_and_an_idle_pass_one():
    job = a_job()
    with CaptureQueriesContext(connections["default"]) as queries:
        assert notify.enqueue("dead", job, incident="dead:1") == []
    assert len(queries) == 0  # no channel: the completion path is as it was
    with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook("http://127.0.0.1:9/x")}):
        with CaptureQueriesContext(connections["default"]) as queries:
            deliver_once()
    assert len(queries) == 1  # a beat's loop with nothing pending: one indexed read a pass


@pytest.mark.parametrize("stored", [7, "pager", {"pager": 1}, [1, None]])
def test_a_jobs_tags_or_channels_written_behind_the_apis_back_count_as_none(stored):
    with override_settings(SCHEDAPP_NOTIFICATIONS=CHANNELS):
        job = a_job("odd")
        Job.objects.filter(pk=job.pk).update(tags=stored, notify=stored)
        job.refresh_from_db()
        assert notify.enqueue("dead", job) == []  # the pager is named only; eu tagged only
