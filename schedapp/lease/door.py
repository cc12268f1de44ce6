"""The door: a worker starts a run only if its claim is current and its lease alive."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from ..models import Job, JobRun, JobState, RunStatus
from ..store import DoorVerdict, get_store
from .after_run import lock_job_and_run

# --- worker side -----------------------------------------------------------------------------
#
# Every write below locks the job row before the run row (the reaper, the claim and the API
# do the same), so the door, renewals, completions and the reaper serialise on the job row: a
# run cannot be both "admitted" and "reaped as never started". Each write is idempotent: when
# its COMMIT lands but the reply is lost and the caller tries again, the second attempt finds
# its own work done and changes nothing.


def admit_run(job_id: int, token: int, worker: str, admission: str) -> DoorVerdict:
    """The door: start the run if its claim is current and its lease has not expired,
    extending the lease unless five sixths of it are left (the job row is then not written);
    otherwise say why not (and close the run if it never will start).

    ``admission`` identifies this door call: a retry of the same call (its first commit landed,
    the reply was lost) is admitted again; another delivery of the same message is not.
    On PostgreSQL this is the function ``schedapp_admit_run_v3`` (sql/functions.sql).
    """
    return get_store().admit(job_id, token, worker, admission)


def admit_replacement(
    job_id: int, token: int, worker: str, carried: str, admission: str
) -> DoorVerdict:
    """The door of a task that replaced the run's task (``Task.replace``): it goes on with the
    run that the ``carried`` admission started, and takes it over under an ``admission`` of
    its own, so another delivery of its message (which carries the same ``carried`` one: a
    broker redelivery while it runs) is refused as a duplicate, as any second delivery is.
    A retry of this same call (its commit landed, its reply was lost) is admitted again.
    Rare, so written through the ORM on every database, with the job row locked first."""
    with transaction.atomic():
        job, run = lock_job_and_run(job_id, token)
        if job is None or run is None:
            return DoorVerdict.UNKNOWN
        if job.token != token:
            return DoorVerdict.STALE_TOKEN
        if job.state not in (JobState.RUNNING, JobState.PAUSED):  # paused: it runs on
            return DoorVerdict.JOB_STATE
        taken = JobRun.objects.filter(
            job_id=job_id, token=token, status=RunStatus.RUNNING, admission__in=(carried, admission)
        )
        if not taken.exists():
            return DoorVerdict.DUPLICATE
        if not Job.objects.filter(id=job_id, lease_expires_at__gt=Now()).exists():
            return DoorVerdict.LEASE_EXPIRED
        taken.update(admission=admission, worker=worker)
    return DoorVerdict.ADMITTED
