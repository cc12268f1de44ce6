"""Signals schedapp sends, declared in one place (as Celery declares its own).

``lease_heartbeat`` is sent by a thread of every worker's main process, every
``SCHEDAPP_LEASE_HEARTBEAT`` seconds, whatever the broker or the pool are doing: schedapp's
receiver renews the leases the worker holds. Connect to it for anything else that must beat
as long as the worker process lives and can reach the database.

The deadline signals (docs/semantics.md, Deadlines) are Django signals, one per kind of
breach, and ``recovered`` when one ends: each is sent once per incident, after the
transaction that recorded it commits, by the beat or worker that recorded it. Receivers get
``breach`` (a ``schedapp.deadlines.BreachEvent``: job id and name, tags, kind, occurrence,
detail). A receiver's exception is logged, never raised into the beat or worker; receivers
run on that process's thread, so keep them short (hand slow work, such as a webhook, to a
queue).
"""

from __future__ import annotations

from celery.utils.dispatch import Signal
from django.dispatch import Signal as DjangoSignal

#: sender: the worker's hostname (``worker1@host``). Receivers run on the heartbeat thread,
#: with its own database connection; keep them short (they delay the next renewal).
lease_heartbeat = Signal(name="schedapp.lease_heartbeat")

#: An occurrence not started within its job's ``start_deadline``.
job_late = DjangoSignal()
#: A run still going after its job's ``max_runtime``.
job_overrunning = DjangoSignal()
#: The day's occurrence had not succeeded by its job's ``finish_by``.
job_missed_finish_by = DjangoSignal()
#: ``alert_after_failures`` failed attempts in a row.
job_failing = DjangoSignal()
#: The job went dead (retries exhausted, or quarantined).
job_dead = DjangoSignal()
#: A breach ended (the late run started, the overrun ended, the job succeeded or was
#: requeued); ``breach.kind`` is the kind that ended.
job_recovered = DjangoSignal()

BREACH_SIGNALS = {
    "late": job_late,
    "overrunning": job_overrunning,
    "missed_finish_by": job_missed_finish_by,
    "failing": job_failing,
    "dead": job_dead,
}

__all__ = [
    "BREACH_SIGNALS",
    "job_dead",
    "job_failing",
    "job_late",
    "job_missed_finish_by",
    "job_overrunning",
    "job_recovered",
    "lease_heartbeat",
]
