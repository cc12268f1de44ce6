"""Overlap policies cancel_other and terminate_other: a run in flight whose job's next
occurrence has come due is cancelled. A beat marks its job ``superseded`` (so that the run's
outcome, whatever it is, moves the job on to the latest occurrence due, never to a retry:
``policies.plan_after_failure``) and, after commit, revokes its Celery task; with terminate
under terminate_other. The claim sets when (``Job.supersede_at``: ``claim._arm_supersede``)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Exists
from django.db.models.functions import Now

from .. import policies
from ..models import ACTIVE_RUN_STATUSES, Job, JobRun, JobState


@dataclass(frozen=True)
class Superseded:
    """A run cancelled by a later occurrence: what to revoke, and how."""

    job_id: int
    token: int
    task_ids: tuple[str, ...]
    terminate: bool


def supersede_due(limit: int = 100) -> list[Superseded]:
    """Mark the runs in flight that a later occurrence supersedes (jobs locked SKIP LOCKED:
    beats share them), in the caller's transaction (the claim's: no commit of its own) or one
    of its own; the caller revokes their tasks after it commits. One statement on the partial
    index of ``supersede_at`` when none is due: as cheap as the number of such runs."""
    out: list[Superseded] = []
    with transaction.atomic(savepoint=False):  # in the claim's: no savepoint statements
        # (supersede_at is compared by the database, never read: a value written behind the
        # API's back that Python cannot hold must not stop the claim it runs in)
        # Gated on the partial index alone (an uncorrelated EXISTS: one probe, then nothing):
        # right after a burst's claims the planner's statistics still see few running jobs
        # and would read every running job through (state, task) to find none to supersede
        # (100,000 jobs: 80-260 ms once a second per beat, in the claim's transaction).
        due = list(
            Job.objects.select_for_update(skip_locked=True)
            .filter(Exists(Job.objects.filter(supersede_at__lte=Now())))
            .filter(
                state=JobState.RUNNING,
                overlap__in=policies.SUPERSEDING,
                supersede_at__lte=Now(),
                superseded=False,
            )
            .order_by("supersede_at")
            .values("id", "token", "overlap")[:limit]
        )
        for job in due:
            task_ids = JobRun.objects.filter(
                job_id=job["id"], token=job["token"], status__in=ACTIVE_RUN_STATUSES
            ).values_list("task_id", flat=True)
            Job.objects.filter(id=job["id"]).update(superseded=True, supersede_at=None)
            out.append(
                Superseded(
                    job["id"],
                    job["token"],
                    tuple(task_ids),
                    job["overlap"] == policies.TERMINATE_OTHER,
                )
            )
    return out
