"""The door: a worker starts a run only if its claim is current and its lease alive. What the
door decides is ``rules.door`` (and ``rules.replacement_door``); this module reads and writes."""

from __future__ import annotations

from django.db import transaction

from ..models import Job
from ..store import DoorVerdict, get_store
from .after_run import run_of
from .rules import LeaseJob, LeaseRun, replacement_door

# --- worker side -----------------------------------------------------------------------------
#
# Every write below locks the job row before the run row (the reaper, the claim and the API
# do the same), so the door, renewals, completions and the reaper serialise on the job row: a
# run cannot be both "admitted" and "reaped as never started". Each write is idempotent: when
# its COMMIT lands but the reply is lost and the caller tries again, the second attempt finds
# its own work done and changes nothing.


def admit_run(
    job_id: int, token: int, worker: str, admission: str, run_id: int | None = None
) -> DoorVerdict:
    """The door: start the run if its claim is current and its lease has not expired,
    extending the lease unless five sixths of it are left (the job row is then not written);
    otherwise say why not (and close the run if it never will start).

    ``admission`` identifies this door call: a retry of the same call (its first commit landed,
    the reply was lost) is admitted again; another delivery of the same message is not.
    ``run_id`` (the message's ``schedapp-run`` header) finds the run by its key, which reaches
    one partition of a partitioned history; a run id that is not this claim's run is
    'unknown'. None: found by job and token.
    On PostgreSQL this is the function ``schedapp_admit_run_v6`` (sql/functions.sql), elsewhere
    the portable store's ``_admit``: both decide as ``rules.door``, which
    ``tests/integration/test_lease_rules_sql.py`` holds them to.
    """
    return get_store().admit(job_id, token, worker, admission, run_id)


def admit_replacement(
    job_id: int, token: int, worker: str, carried: str, admission: str
) -> DoorVerdict:
    """The door of a task that replaced the run's task (``Task.replace``): it goes on with the
    run that the ``carried`` admission started, and takes it over under an ``admission`` of
    its own, so another delivery of its message (which carries the same ``carried`` one: a
    broker redelivery while it runs) is refused as a duplicate, as any second delivery is.
    A retry of this same call (its commit landed, its reply was lost) is admitted again.
    Rare, so written through the ORM on every database, with the job row locked first; the
    decision is ``rules.replacement_door``'s."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .filter(id=job_id)
            .values("token", "state", "lease_expires_at")
            .first()
        )
        runs = run_of(job_id, token)
        run = runs.values("status", "admission").first()
        decision = replacement_door(
            LeaseJob(**job) if job is not None else None,
            LeaseRun(**run) if run is not None else None,
            token,
            carried,
            admission,
            get_store().now(),
        )
        if decision.take_over:
            runs.update(admission=admission, worker=worker)
    return DoorVerdict(decision.verdict)
