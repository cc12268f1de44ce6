"""What an operator can do to a job from the admin, and who may: one table, used by the bulk
actions of the changelist and by the buttons of the job page.

Every operation goes through ``schedapp.api`` (which validates, locks the row, moves the
fencing token and wakes the beats); the admin never writes a job's state itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from .. import api, audit
from ..exceptions import JobStateError
from ..models import Job, JobState

# Most jobs one bulk action touches (each is its own short transaction).
ACTION_LIMIT = 1_000
# Per-job errors listed one by one before they are summarised.
ERRORS_SHOWN = 10

_ALL_STATES = tuple(JobState.values)


@dataclass(frozen=True)
class Operation:
    slug: str  # action name and URL part
    label: str  # button text
    permission: str  # ModelAdmin.has_<permission>_permission
    api_function: str  # name in schedapp.api
    done: str  # what happened, for the message
    states: tuple[str, ...]  # states in which the job page offers the button
    style: str = ""

    def call(self, job_id: int) -> Job:
        function: Callable[[int], Job] = getattr(api, self.api_function)
        return function(job_id)


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "run_now",
        "Run now",
        "run",
        "run_now",
        "will run at the next tick",
        (JobState.SCHEDULED, JobState.SUCCEEDED, JobState.DEAD),
        "default",
    ),
    Operation("pause", "Pause", "pause", "pause", "paused", (JobState.SCHEDULED, JobState.RUNNING)),
    Operation("resume", "Resume", "pause", "resume", "resumed", (JobState.PAUSED,)),
    Operation(
        "requeue",
        "Requeue",
        "requeue",
        "requeue",
        "requeued from the dead letters",
        (JobState.DEAD,),
        "default",
    ),
    Operation(
        "duplicate", "Duplicate", "add", "duplicate", "duplicated (created paused)", _ALL_STATES
    ),
    Operation(
        "cancel",
        "Cancel",
        "cancel",
        "cancel",
        "cancelled",
        (JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED, JobState.DEAD),
        "danger",
    ),
)
BY_SLUG = {op.slug: op for op in OPERATIONS}


@contextmanager
def acting_in_admin(request: HttpRequest, reason: str = "") -> Iterator[audit.Actor]:
    """What the admin changes is recorded in the audit trail as its user's, source admin."""
    user = getattr(request, "user", None)
    who = user.get_username() if user is not None and user.is_authenticated else "anonymous"
    with audit.acting(who, source="admin", reason=reason) as actor:
        yield actor


def error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        if hasattr(exc, "error_dict"):
            return "; ".join(
                f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items()
            )
        return " ".join(exc.messages)
    return str(exc)


def _names(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    more = len(names) - limit
    return f"{shown} and {more} more" if more > 0 else shown


def apply_operation(
    model_admin: Any, request: HttpRequest, op: Operation, jobs: Sequence[tuple[int, str]]
) -> list[Job]:
    """Run ``op`` on each job, then tell the operator what happened, job by job for errors."""
    done: list[str] = []
    results: list[Job] = []
    errors: list[str] = []
    for job_id, name in jobs[:ACTION_LIMIT]:
        try:
            with acting_in_admin(request):
                result = op.call(job_id)
        except (JobStateError, ValidationError, Job.DoesNotExist) as exc:
            errors.append(f"{name}: {error_text(exc)}")
            continue
        results.append(result)
        done.append(f"{name} as {result.name}" if op.slug == "duplicate" else name)
    if done:
        count = f"{len(done)} job{'s' if len(done) != 1 else ''}"
        model_admin.message_user(
            request, f"{op.label}: {count} {op.done}: {_names(done)}.", messages.SUCCESS
        )
    for text in errors[:ERRORS_SHOWN]:
        model_admin.message_user(request, f"{op.label} failed for {text}", messages.ERROR)
    if len(errors) > ERRORS_SHOWN:
        model_admin.message_user(
            request,
            f"{op.label} failed for {len(errors) - ERRORS_SHOWN} more jobs.",
            messages.ERROR,
        )
    if len(jobs) > ACTION_LIMIT:
        model_admin.message_user(
            request,
            f"Only the first {ACTION_LIMIT:,} selected jobs were processed; "
            "select fewer (or filter) and run the action again.",
            messages.WARNING,
        )
    return results


def make_action(op: Operation) -> Callable[..., None]:
    """A changelist action for ``op``, shown only to users with its permission."""

    def action(model_admin: Any, request: HttpRequest, queryset: Any) -> None:
        jobs = list(queryset.order_by("pk").values_list("pk", "name")[: ACTION_LIMIT + 1])
        apply_operation(model_admin, request, op, jobs)

    action.__name__ = op.slug
    action.allowed_permissions = (op.permission,)  # type: ignore[attr-defined]
    action.short_description = f"{op.label} selected jobs"  # type: ignore[attr-defined]
    return action
