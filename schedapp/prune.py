"""Delete old run history (and the ledger's records of occurrences that did not run) in small
batches, so pruning never holds long locks.

On PostgreSQL whole expired partitions of both tables go first (``schedapp.partitions``:
dropped in constant time each, outside a transaction); the batches delete what is left.
Each batch is its own short transaction: select up to ``batch_size`` ids of finished runs
older than the cutoff (an index range on ``finished_at``), delete exactly those ids, commit.
Beats and workers keep inserting and updating runs meanwhile; only the rows being deleted are
locked, for milliseconds. Runs still ``dispatched`` or ``running`` are never deleted.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import QuerySet

from .db import db_now
from .models import ACTIVE_RUN_STATUSES, JobRun, Occurrence
from .partitions import TABLES, drop_expired_partitions

log = logging.getLogger("schedapp.prune")

DEFAULT_BATCH = 5_000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_age(text: str) -> timedelta:
    """'30d', '12h', '90m', '3600s', '2w' -> timedelta; ValueError for anything else."""
    match = _AGE.match(text or "")
    if not match:
        raise ValueError(
            f"{text!r} is not an age; use a number and a unit: 30d, 12h, 90m, 3600s or 2w."
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{text!r} must be more than zero.")
    return timedelta(seconds=value)


@dataclass(frozen=True)
class PruneResult:
    deleted: int
    batches: int
    cutoff: str
    seconds: float
    # PostgreSQL: partitions of runs and of ledger records dropped whole (their rows are not
    # counted in ``deleted``)
    dropped_partitions: tuple[str, ...] = ()


def prune_runs(
    older_than: timedelta,
    *,
    batch_size: int = DEFAULT_BATCH,
    max_batches: int | None = None,
    pause: float = 0.0,
    dry_run: bool = False,
) -> PruneResult:
    """Delete runs that finished more than ``older_than`` ago (by the database clock).

    ``pause`` seconds between batches leave room for other writers on a busy database;
    ``max_batches`` bounds one call (a scheduled prune can catch up over several nights).
    ``dry_run`` counts instead of deleting.
    """
    if older_than <= timedelta(0):
        raise ValueError("older_than must be positive")
    started = time.monotonic()
    cutoff = db_now() - older_than
    # A run finished before the cutoff was dispatched before it too: the condition on
    # dispatched_at (indexed, and never rewritten) finds them; finished_at (not indexed, so
    # that a completion stays a heap-only update) confirms each.
    old = JobRun.objects.filter(dispatched_at__lt=cutoff, finished_at__lt=cutoff).exclude(
        status__in=ACTIVE_RUN_STATUSES
    )
    if dry_run:
        count = old.count() + Occurrence.objects.filter(recorded_at__lt=cutoff).count()
        return PruneResult(count, 0, cutoff.isoformat(), time.monotonic() - started)
    # PostgreSQL: whole partitions of expired runs, then of expired ledger records, dropped
    # first, in constant time each (schedapp.partitions); the batches below delete what is
    # left, in the partitions kept.
    dropped = [
        name for table in TABLES for name in drop_expired_partitions(older_than, table=table)
    ]
    # The conditions again with the ids: a run that changed meanwhile is left alone.
    # JobRun has no dependants, so each batch is one DELETE ... WHERE id IN (...).
    deleted, batches = _delete_in_batches(old, "dispatched_at", batch_size, max_batches, pause)
    # The ledger's records of occurrences that did not run are kept as long as the runs: a
    # timeline reads both, so one outliving the other would tell half the story.
    records = Occurrence.objects.filter(recorded_at__lt=cutoff)
    deleted += _delete_in_batches(records, "recorded_at", batch_size, max_batches, pause)[0]
    result = PruneResult(
        deleted, batches, cutoff.isoformat(), time.monotonic() - started, tuple(dropped)
    )
    log.info(
        "pruned %d run(s) finished before %s in %d batch(es), %d partition(s) dropped",
        deleted,
        result.cutoff,
        batches,
        len(dropped),
        extra={"action": "prune", "deleted": deleted},
    )
    return result


def _delete_in_batches(
    old: QuerySet, order: str, batch_size: int, max_batches: int | None, pause: float
) -> tuple[int, int]:
    """Delete ``old``'s rows, oldest by ``order`` first, ``batch_size`` a short transaction,
    at most ``max_batches`` batches; (rows deleted, batches)."""
    deleted = batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic():
            ids = list(old.order_by(order).values_list("id", flat=True)[:batch_size])
            if not ids:
                break
            count, _by_model = old.filter(id__in=ids).delete()
        deleted += max(count, 0)
        batches += 1
        if len(ids) < batch_size:
            break
        if pause:
            time.sleep(pause)
    return deleted, batches
