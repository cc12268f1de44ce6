"""The occurrence ledger's writes: what did not run, and why, recorded in the transaction that
decided it (the claim's misfires, a resume, a cancel, a quarantine). What ran is its runs.

Reading it back as answers ("what happened at 08:00?") is ``schedapp.explain``, through
``first_records``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Exists, OuterRef, QuerySet

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


def first_records(
    records: QuerySet[Occurrence], recorded_since: datetime | None = None
) -> QuerySet[Occurrence]:
    """``records`` less any that a record of the same (job, scheduled_for) with a lower id
    precedes: the first decision stands for its readers too. On PostgreSQL the ledger is
    partitioned by id and (job, scheduled_for) is unique within a partition only, so a
    decision repeated across a partition boundary (a claim repeating itself after a lost
    reply, a resume and the claim after it) writes a second record, which ``ON CONFLICT DO
    NOTHING`` keeps out within one.

    Each record costs an index probe of the job's records (of the partitions below its id),
    cheap for one job's reads; a read of the whole fleet's records over a window would make
    it a scan of the whole ledger. ``recorded_since`` looks for the earlier records among
    those recorded since then only (the window read), at the cost of counting a second
    record whose first was recorded before it."""
    earlier = Occurrence.objects.filter(
        job_id=OuterRef("job_id"), scheduled_for=OuterRef("scheduled_for"), id__lt=OuterRef("id")
    )
    if recorded_since is not None:
        earlier = earlier.filter(recorded_at__gte=recorded_since)
    return records.filter(~Exists(earlier))
