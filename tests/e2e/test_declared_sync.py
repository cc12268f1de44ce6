"""Declared jobs synced at beat start, with real beats and workers: a deploy's sync never lets
a running job's lease lapse, and in a rolling deploy the newest declarations win."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from project.models import Execution
from schedapp import api, declared
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.LOST)
NEVER = "0 3 1 1 *"  # 03:00 on January 1st: nothing fires by itself during a test


def jobs_env(jobs: dict[str, Any], **extra: Any) -> dict[str, str]:
    """A beat's settings through its environment (project/settings_test.py reads them)."""
    return {"SCHEDAPP_JOBS": json.dumps(jobs), **{k: json.dumps(v) for k, v in extra.items()}}


def test_a_deploy_changing_many_declarations_never_lets_a_running_jobs_lease_lapse(fleet):
    # Given a declared job with a 3 s lease that runs 40 s (longer than the sync), and 1,500
    # other declared jobs
    fillers = 1500
    before: dict[str, Any] = {
        "long": {
            "task": "project.tasks.record",
            "cron": NEVER,
            "kwargs": {"label": "long", "sleep": 40},
            "lease_seconds": 3,
            "retry_backoff": 0,
        },
        **{
            f"filler-{i}": {"task": "project.tasks.noop", "cron": NEVER, "kwargs": {"v": 1}}
            for i in range(fillers)
        },
    }
    with override_settings(SCHEDAPP_JOBS=before):
        declared.sync_declared_jobs()
    fleet.worker(concurrency=2, heartbeat=1)
    fleet.beat(jobs_env(before))
    long = Job.objects.get(name="long")
    api.run_now(long)
    wait_until(
        lambda: Execution.objects.filter(job_id=long.pk).exists(),
        timeout=30,
        message="the long job started",
    )
    # When a deploy changes every declaration (the long job's first) and its beat starts
    after = {name: {**spec, "kwargs": {"v": 2}} for name, spec in before.items()}
    after["long"] = {**before["long"], "kwargs": {"label": "long", "sleep": 39}}
    deployed = fleet.beat(jobs_env(after), wait=False)
    deployed.wait_for("declared jobs: ", timeout=180)
    # Then every change is applied, and the long job ran once: its lease was renewed throughout
    wait_until(
        lambda: JobRun.objects.filter(
            job=long, started_at__isnull=False, status__in=ENDED
        ).exists(),
        timeout=150,
        message="the long run ended",
    )
    runs = list(JobRun.objects.filter(job=long).order_by("id"))
    described = [(r.status, r.started_at is not None, r.heartbeats, r.error) for r in runs]
    # (on a loaded machine a copy sent before the worker took it may be sent again: a copy no
    # door admitted is never executed)
    started = [r for r in runs if r.started_at is not None]
    assert [(r.status, r.stale) for r in started] == [(RunStatus.SUCCEEDED, False)], described
    assert Execution.objects.filter(job_id=long.pk).count() == 1
    assert Job.objects.get(pk=long.pk).kwargs == {"label": "long", "sleep": 39}
    assert Job.objects.filter(name__startswith="filler-", kwargs={"v": 2}).count() == fillers


def _beat_syncs(fleet, jobs: dict[str, Any], **settings: Any) -> None:
    """A beat of one release starts (its sync done when it logs its start) and stops."""
    beat = fleet.beat(jobs_env(jobs, **settings), wait=False)
    beat.wait_for("schedapp.beat: beat ", timeout=60)
    beat.stop()


def _state() -> dict[str, tuple[str, dict]]:
    return {j.name: (j.state, j.kwargs) for j in Job.objects.filter(name__in="ABCD")}


@pytest.mark.parametrize("release", [None, "r"], ids=["no-release-setting", "SCHEDAPP_RELEASE"])
def test_in_a_rolling_deploy_the_newest_declarations_win_whatever_order_beats_start_in(
    fleet, release
):
    def spec(version: int) -> dict[str, Any]:
        return {"task": "project.tasks.noop", "cron": NEVER, "kwargs": {"v": version}}

    def on(number: int) -> dict[str, Any]:
        return {"SCHEDAPP_RELEASE": f"{release}{number}"} if release else {}

    old = {"A": spec(1), "C": spec(1), "D": spec(1)}  # release 1
    new = {"A": spec(2), "B": spec(2), "D": spec(1)}  # release 2: A changed, B new, C gone
    # Given release 1's beat synced, then release 2's (a rolling deploy), and a person paused D
    _beat_syncs(fleet, old, **on(1))
    _beat_syncs(fleet, new, **on(2))
    api.pause(Job.objects.get(name="D"))
    synced = {
        "A": ("scheduled", {"v": 2}),
        "B": ("scheduled", {"v": 2}),
        "C": ("paused", {"v": 1}),  # paused because release 2 stopped declaring it
        "D": ("paused", {"v": 1}),
    }
    assert _state() == synced
    # When a beat of release 1 restarts, then one of release 2 again
    _beat_syncs(fleet, old, **on(1))
    # Then release 1 reverted and paused nothing of release 2's
    assert _state() == synced
    _beat_syncs(fleet, new, **on(2))
    assert _state() == synced
    # And when release 3 declares C again, the job its predecessor paused comes back; the
    # one a person paused stays paused
    _beat_syncs(fleet, {**new, "C": spec(3)}, **on(3))
    assert _state() == {**synced, "C": ("scheduled", {"v": 3})}
    assert Job.objects.get(name="C").state == JobState.SCHEDULED
