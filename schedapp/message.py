"""What a schedapp message says, written in one place and read back in one place.

A dispatched run is a plain Celery protocol-2 task message. Its task id names the claim
(``schedapp:<job>:<token>``), which is all a worker hook needs to fence its writes; the headers
add what the task itself may ask (``schedapp.current_run()``) and what lets a worker record a
success without reading the job first (the schedule the claim saw). Pure: no Django, no Celery.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

TASK_ID_PREFIX = "schedapp:"

HEADER_JOB = "schedapp_job"
HEADER_RUN = "schedapp_run"
HEADER_TOKEN = "schedapp_token"
HEADER_SCHEDULED_FOR = "schedapp_scheduled_for"
HEADER_ATTEMPT = "schedapp_attempt"
HEADER_KEY = "schedapp_key"
HEADER_LEASE = "schedapp_lease"
# The job's schedule as the claim read it, as compact JSON: a worker computes the next
# occurrence from it and records a success in one statement, guarded by "the schedule is
# still this one" (an edit while the run was in flight takes the slow path).
HEADER_SCHEDULE = "schedapp_schedule"
# The admission (the door call) that started the run: carried only by the message of a task
# that replaced the run's task (``Task.replace``), whose door then admits it as the same run.
HEADER_ADMISSION = "schedapp_admission"
# Present (true) on a run with a lease of its own (overlap policy allow_all): its outcome is
# recorded on the general path, never by the one-call success, which fences on the job.
HEADER_OWN_LEASE = "schedapp_own_lease"
RUN_HEADERS = (
    HEADER_JOB,
    HEADER_RUN,
    HEADER_TOKEN,
    HEADER_SCHEDULED_FOR,
    HEADER_ATTEMPT,
    HEADER_KEY,
    HEADER_LEASE,
    HEADER_SCHEDULE,
    HEADER_OWN_LEASE,
)


def task_id_for(job_id: int, token: int) -> str:
    """The Celery task id of one claim: deterministic, so a re-publish is harmless to trace,
    and enough for any worker signal to find its run (a run is unique per job and token)."""
    return f"{TASK_ID_PREFIX}{job_id}:{token}"


def parse_task_id(task_id: str | None) -> tuple[int, int] | None:
    """(job_id, token) from a schedapp task id; None for any other task."""
    if not task_id or not task_id.startswith(TASK_ID_PREFIX):
        return None
    try:
        job, token = task_id[len(TASK_ID_PREFIX) :].split(":")
        return int(job), int(token)
    except ValueError:
        return None


def idempotency_key(job_id: int, scheduled_for: datetime) -> str:
    """Stable across retries and re-dispatches of one occurrence of one job."""
    return f"schedapp:{job_id}:{scheduled_for.astimezone(UTC).isoformat()}"


@dataclass(frozen=True)
class ScheduleRef:
    """A recurring job's schedule as stored: enough to compute its next occurrence."""

    cron: str = ""
    timezone: str = "UTC"
    interval: timedelta | None = None
    anchor: datetime | None = None  # an interval's phase
    day_or: bool = True  # a cron's day rule: False is Celery's (both day fields must match)

    def encode(self) -> str:
        if self.interval is not None:
            anchor = self.anchor.isoformat() if self.anchor else None
            return json.dumps({"interval": self.interval.total_seconds(), "anchor": anchor})
        if not self.day_or:
            return json.dumps({"cron": self.cron, "tz": self.timezone, "and": True})
        return json.dumps({"cron": self.cron, "tz": self.timezone})

    @classmethod
    def decode(cls, text: str | None) -> ScheduleRef | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            if "interval" in data:
                anchor = data.get("anchor")
                return cls(
                    interval=timedelta(seconds=float(data["interval"])),
                    anchor=datetime.fromisoformat(anchor) if anchor else None,
                )
            return cls(cron=str(data["cron"]), timezone=str(data["tz"]), day_or=not data.get("and"))
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class RunHeaders:
    """The schedapp headers of a delivered message, read back."""

    job_id: int
    run_id: int
    token: int
    scheduled_for: datetime
    attempt: int
    idempotency_key: str
    schedule: ScheduleRef | None
    own_lease: bool = False

    @classmethod
    def read(cls, headers: Mapping[str, Any]) -> RunHeaders | None:
        """From a mapping of headers (a Celery request's); None if schedapp did not send it."""
        job = headers.get(HEADER_JOB)
        if job is None:
            return None
        return cls(
            job_id=int(job),
            run_id=int(headers[HEADER_RUN]),
            token=int(headers[HEADER_TOKEN]),
            scheduled_for=datetime.fromisoformat(headers[HEADER_SCHEDULED_FOR]),
            attempt=int(headers[HEADER_ATTEMPT]),
            idempotency_key=str(headers[HEADER_KEY]),
            schedule=ScheduleRef.decode(headers.get(HEADER_SCHEDULE)),
            own_lease=bool(headers.get(HEADER_OWN_LEASE)),
        )
