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


def lockable(name: str) -> bool:
    """Whether another transaction could lock the job's row now (FOR UPDATE NOWAIT)."""
    with other_connection() as other:
        try:
            other.execute("SELECT id FROM schedapp_job WHERE name = %s FOR UPDATE NOWAIT", [name])
        except psycopg.errors.LockNotAvailable:
            return False
        return True


def probing_updates(monkeypatch: Any, first: str) -> list[bool]:
    """Before each api.update after the first, whether job ``first``'s row is free."""
    seen: list[bool] = []
    update = api.update

    def probe(job, **changes):  # type: ignore[no-untyped-def]
        if Job.objects.get(pk=job if isinstance(job, int) else job.pk).name != first:
            seen.append(lockable(first))
        return update(job, **changes)

    monkeypatch.setattr(api, "update", probe)
    return seen
