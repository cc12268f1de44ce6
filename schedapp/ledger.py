"""The occurrence ledger's writes: what did not run, and why, recorded in the transaction that
decided it (the claim's misfires, a resume, a cancel, a quarantine). What ran is its runs.

Reading it back as answers ("what happened at 08:00?") is ``schedapp.explain``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS

from .models import Occurrence
from .policies import MissedRange


def record(
    decided: Iterable[tuple[int, MissedRange]], decided_by: str, using: str = DEFAULT_DB_ALIAS
) -> int:
    """One record per (job id, range), in one statement. A range whose first occurrence has a
    record already keeps that one (the first decision stands: a claim that repeats itself
    after a lost reply, a resume and the claim after it deciding the same occurrence)."""
    rows = [
        Occurrence(
            job_id=job_id,
            scheduled_for=r.first,
            last=r.last,
            count=r.count,
            fate=r.fate,
            detail=r.detail[:2000],
            decided_by=decided_by[:200],
        )
        for job_id, r in decided
        if r.count > 0
    ]
    if rows:
        Occurrence.objects.using(using).bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def record_one(
    job_id: int,
    at: datetime,
    fate: str,
    detail: str,
    decided_by: str,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """One occurrence that will not run (a cancel, a quarantine, a run refused late)."""
    record([(job_id, MissedRange(at, at, 1, fate, detail))], decided_by, using)
