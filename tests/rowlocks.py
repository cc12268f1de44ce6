"""Whether a job's row is free while schedapp writes others: a second connection tries to
lock it as a lease renewal or a door would, without waiting (DESIGN.md note 23)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection

from schedapp import api
from schedapp.models import Job


@contextmanager
def other_connection() -> Iterator[psycopg.Connection]:
    """A connection of its own to the test database (a renewal, a door)."""
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=db["USER"] or None,
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
    ) as other:
        yield other


def lockable(name: str, other: psycopg.Connection | None = None) -> bool:
    """Whether another transaction could lock the job's row now (FOR UPDATE NOWAIT), on
    ``other`` (a transaction of its own, rolled back after) or on a new connection."""
    if other is None:
        with other_connection() as new:
            return lockable(name, new)
    try:
        other.execute("SELECT id FROM schedapp_job WHERE name = %s FOR UPDATE NOWAIT", [name])
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        other.rollback()
    return True


@contextmanager
def probing_updates(monkeypatch: Any, first: str) -> Iterator[list[bool]]:
    """While open, before each api.update after the first, whether job ``first``'s row is
    free. One connection does every probe (a new one each was about 40 ms: 2.5 s of a
    60-job sync's test), closed at the end so the test database can be dropped."""
    seen: list[bool] = []
    update = api.update

    with other_connection() as other:

        def probe(job, **changes):  # type: ignore[no-untyped-def]
            if Job.objects.get(pk=job if isinstance(job, int) else job.pk).name != first:
                seen.append(lockable(first, other))
            return update(job, **changes)

        monkeypatch.setattr(api, "update", probe)
        try:
            yield seen
        finally:
            monkeypatch.setattr(api, "update", update)
