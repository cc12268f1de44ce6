"""The lease protocol: the only code that writes a job's lease, its fencing token and its
dispatch counter (``tests/unit/test_lease_writers.py`` holds every other module to that).

Vocabulary: a beat *claims* due jobs (lease + new fencing token + a run row, in one
transaction, ``claim``), a worker *admits* a run at its door (``door``), *renews* the leases it
holds while it works (``renew``) and *completes* the run (``complete``); a beat *releases*
claims it could not publish (``claim``) and *reaps* leases that expired (``reap``); a person
resumes, runs now, requeues or cancels (``manual``); under overlap policies cancel_other and
terminate_other a beat cancels a run a later occurrence supersedes (``supersede``). Every
write after a claim is fenced by ``(job_id, token)`` and its row count checked: no row means
the lease was lost, and nothing newer is ever overwritten. The storage seam
(``schedapp.store``) holds what differs between PostgreSQL (``schedapp/sql/``) and the
portable store; only this package calls its writes.
"""

from __future__ import annotations

from ..store import DoorVerdict
from .after_run import EXPIRED, job_schedule
from .claim import (
    ClaimedRun,
    ClaimResult,
    claim_due_jobs,
    give_back,
    release_claims,
    seconds_until_due,
)
from .complete import (
    FAILED,
    SKIPPED,
    SUCCEEDED,
    Completion,
    CompletionResult,
    admit_run_after_successes,
    complete_run,
    complete_successes,
    record_cancelled,
    record_expired,
)
from .door import admit_replacement, admit_run
from .manual import cancel_locked, requeue_locked, resume_locked, run_now_locked
from .quarantine import ROW_ERRORS, Quarantined, job_label, quarantine_job
from .reap import MessageExpiry, ReapResult, reap_expired_leases
from .renew import Renewal, renew_leases
from .supersede import Superseded, supersede_due

__all__ = [
    "EXPIRED",
    "FAILED",
    "ROW_ERRORS",
    "SKIPPED",
    "SUCCEEDED",
    "ClaimResult",
    "ClaimedRun",
    "Completion",
    "CompletionResult",
    "DoorVerdict",
    "MessageExpiry",
    "Quarantined",
    "ReapResult",
    "Renewal",
    "Superseded",
    "admit_replacement",
    "admit_run",
    "admit_run_after_successes",
    "cancel_locked",
    "claim_due_jobs",
    "complete_run",
    "complete_successes",
    "give_back",
    "job_label",
    "job_schedule",
    "quarantine_job",
    "reap_expired_leases",
    "record_cancelled",
    "record_expired",
    "release_claims",
    "renew_leases",
    "requeue_locked",
    "resume_locked",
    "run_now_locked",
    "seconds_until_due",
    "supersede_due",
]
