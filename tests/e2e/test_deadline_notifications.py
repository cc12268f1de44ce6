"""Each deadline kind, end to end, to a team's channels: a real beat (its deadline pass and its
delivery loop) and a real prefork worker; a real SMTP sink (aiosmtpd) and a real HTTP
receiver that checks the HMAC on its own. Each breach makes exactly one message on each
channel, and its recovery exactly one more. Group wait and the deadline pass are short, so a
test takes seconds; a recovery is brought about only after the alert reached both channels
(a recovery of an unsent alert withdraws it: nothing would be sent, by design)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Breach, Job, Notification
from schedapp.testing.fleet import Fleet
from schedapp.testing.processes import wait_until
from tests.receivers import SECRET, Receiver, Sink, smtp_sink, webhook_receiver

pytestmark = [pytest.mark.e2e]

FAST = {"group_wait": 0.5, "group_interval": 1}


@dataclass
class Team:
    """The fleet's settings and the two places its notifications land."""

    env: dict[str, object]
    sink: Sink
    receiver: Receiver

    def subjects(self) -> list[str]:
        return [m["Subject"] for m in self.sink.messages]

    def hook_counts(self) -> list[dict[str, int]]:
        return [d.body["counts"] for d in self.receiver.received]

    def told(self, n: int) -> bool:
        return len(self.sink.messages) >= n and len(self.receiver.received) >= n


@contextmanager
def team_channels(timing: dict[str, float] = FAST) -> Iterator[Team]:
    with smtp_sink() as sink, webhook_receiver() as receiver:
        channels = {
            "mail": {"type": "email", "to": ["ops@example.com"], **timing},
            "hook": {"type": "webhook", "url": receiver.url, "secret": SECRET, **timing},
        }
        env: dict[str, object] = {
            "SCHEDAPP_NOTIFICATIONS": json.dumps(channels),
            "SCHEDAPP_DEADLINE_CHECK": 0.5,
            "PROJECT_EMAIL_PORT": sink.port,
        }
        yield Team(env, sink, receiver)


@pytest.fixture
def team(fleet: Fleet) -> Iterator[Team]:
    with team_channels() as t:
        yield t


def assert_alerted_then_recovered(team: Team, job: Job, kind: str) -> None:
    """Exactly one alert and one recovery on each channel, signed, about this job, under
    one incident; nothing left in the outbox that could send a third."""
    wait_until(
        lambda: Notification.objects.filter(sent_at__isnull=False).count() == 4,
        timeout=20,
        message="4 notifications sent",
    )
    assert not Notification.objects.filter(sent_at=None).exists()
    assert team.subjects() == [
        f"[schedapp] 1 {kind}: {job.name}",
        f"[schedapp] 1 recovered: {job.name}",
    ]
    assert team.hook_counts() == [{kind: 1}, {"recovered": 1}]
    assert all(d.signed and d.status == 200 for d in team.receiver.received)
    (breach,) = Breach.objects.filter(job=job)
    assert breach.kind == kind and breach.cleared_at is not None
    incidents = {e["incident"] for d in team.receiver.received for e in d.body["events"]}
    assert incidents == {f"breach:{breach.pk}"}
    jobs = {e["job"]["id"] for d in team.receiver.received for e in d.body["events"]}
    assert jobs == {job.pk}


def test_late_a_stopped_worker_then_back(fleet, team):
    # Given a beat, and the only worker stopped
    fleet.beat(settings=team.env)
    fleet.worker(concurrency=1, settings=team.env).stop()
    # When a job with a 2 s start deadline comes due
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "late"},
        run_at=db_now(),
        start_deadline=2,
        lease_seconds=60,
        name="late-report",
    )
    # Then each channel is told once that it is late
    wait_until(lambda: team.told(1), timeout=30, message="late alert")
    # When a worker comes back, the run starts: each channel is told it recovered
    fleet.worker(concurrency=1, pool="prefork", settings=team.env)
    wait_until(lambda: team.told(2), timeout=40, message="recovered")
    assert_alerted_then_recovered(team, job, "late")
    assert Breach.objects.get(job=job).cleared_detail == "started"


def test_overrunning_a_run_past_its_max_runtime_then_ended(fleet, team):
    fleet.beat(settings=team.env)
    fleet.worker(concurrency=1, pool="prefork", settings=team.env)
    # Given a 12 s task with a 2 s max runtime (not revoked)
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "long", "sleep": 12},
        run_at=db_now(),
        max_runtime=2,
        max_retries=0,
        name="long-export",
    )
    # Then each channel is told once it overruns, while it runs
    wait_until(lambda: team.told(1), timeout=30, message="overrunning alert")
    assert Notification.objects.filter(kind="recovered").count() == 0
    # When the run ends, each channel is told it recovered
    wait_until(lambda: team.told(2), timeout=40, message="recovered")
    assert_alerted_then_recovered(team, job, "overrunning")
    assert Breach.objects.get(job=job).cleared_detail == "the run ended"


def test_a_revoked_overrun_is_told_though_it_ended_within_group_wait(fleet):
    # Given channels waiting 6 s to group, and a 30 s task with a 2 s max runtime, revoked
    with team_channels({"group_wait": 6, "group_interval": 1}) as team:
        fleet.beat(settings=team.env)
        fleet.worker(concurrency=1, pool="prefork", settings=team.env)
        job = api.schedule(
            "project.tasks.record",
            kwargs={"label": "long", "sleep": 30},
            run_at=db_now(),
            max_runtime=2,
            revoke_overrun=True,
            max_retries=0,
            name="runaway",
        )
        # When it is revoked and its run closed before the channels' group_wait ends
        wait_until(
            lambda: Notification.objects.filter(kind="recovered").count() == 2,
            timeout=30,
            message="recovery queued",
        )
        assert Notification.objects.filter(kind="overrunning", sent_at=None).count() == 2
        # Then each channel still says it overran (revoked), and that it ended, in one message
        # (with the job's dead-lettering: the revoked attempt was its last, max_retries=0)
        wait_until(lambda: team.told(1), timeout=30, message="told")
        wait_until(lambda: not Notification.objects.filter(sent_at=None).exists(), timeout=10)
        assert team.subjects() == ["[schedapp] 1 overrunning, 1 dead, 1 recovered: runaway"]
        assert team.hook_counts() == [{"overrunning": 1, "dead": 1, "recovered": 1}]
        assert team.receiver.received[0].signed
        assert "revoked (revoke_overrun)" in team.sink.messages[0].get_payload()
        assert Breach.objects.get(job=job, kind="overrunning").cleared_at is not None


def a_zone_away_from_midnight(now: datetime) -> str:
    """A zone where the next minute is not near local midnight, so that a finish_by a few
    seconds ahead falls on the same local day as the occurrences before it."""
    for zone in ("Europe/Paris", "Asia/Tokyo", "America/New_York", "Asia/Kolkata"):
        local = now.astimezone(ZoneInfo(zone))
        if 1 <= local.hour <= 22:
            return zone
    raise AssertionError("every zone tried is near midnight")  # pragma: no cover


def test_missed_finish_by_then_a_success(fleet, team):
    fleet.beat(settings=team.env)
    fleet.worker(concurrency=1, pool="prefork", settings=team.env)
    # Given a job failing every 2 s, to be done by a wall-clock time 6 s ahead in its zone
    now = db_now()
    zone = a_zone_away_from_midnight(now)
    finish_by = (now + timedelta(seconds=6)).astimezone(ZoneInfo(zone)).time()
    job = api.schedule(
        "project.tasks.fail",
        kwargs={"label": "f"},
        interval=2,
        timezone=zone,
        max_retries=0,
        when_retries_exhausted="next_occurrence",
        finish_by=finish_by.replace(microsecond=0),
        name="nightly-close",
    )
    # Then, past the deadline with no success, each channel is told once
    wait_until(lambda: team.told(1), timeout=40, message="missed finish_by alert")
    # When the task is fixed, the next success recovers it
    api.update(job, task="project.tasks.record")
    wait_until(lambda: team.told(2), timeout=40, message="recovered")
    api.pause(job)
    assert_alerted_then_recovered(team, job, "missed_finish_by")
    assert Breach.objects.get(job=job).cleared_detail == "succeeded"


def test_failing_after_n_failures_then_a_success(fleet, team):
    fleet.beat(settings=team.env)
    fleet.worker(concurrency=1, pool="prefork", settings=team.env)
    # Given a job failing every 2 s, failing after 3 in a row
    job = api.schedule(
        "project.tasks.fail",
        kwargs={"label": "f"},
        interval=2,
        max_retries=0,
        when_retries_exhausted="next_occurrence",
        alert_after_failures=3,
        name="sync-ledger",
    )
    wait_until(lambda: team.told(1), timeout=40, message="failing alert")
    # When its task is fixed, the next success recovers it
    api.update(job, task="project.tasks.record")
    wait_until(lambda: team.told(2), timeout=40, message="recovered")
    api.pause(job)
    assert_alerted_then_recovered(team, job, "failing")
    assert Breach.objects.get(job=job).cleared_detail == "succeeded"
