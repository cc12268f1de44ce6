"""One storage seam, two implementations; ``get_store()`` is the one place that picks.

See ``base.Store`` for the interface: the claim, the next due instant, the door, renewals,
one-call successes, notifications and LISTEN, the overview's reads, and the bulk insert of
new jobs. A store is bound to one database alias (``using``); ``get_store()`` is the default's.
"""

from __future__ import annotations

from functools import lru_cache

from django.db import connection

from .base import (
    CopyingStore,
    DoorVerdict,
    InsertedJobs,
    JobRows,
    Listener,
    NameTaken,
    Store,
    insert_runs,
    pairs,
)
from .portable import PortableStore
from .postgresql import PostgreSQLStore

__all__ = [
    "CopyingStore",
    "DoorVerdict",
    "InsertedJobs",
    "JobRows",
    "Listener",
    "NameTaken",
    "PortableStore",
    "PostgreSQLStore",
    "Store",
    "get_store",
    "insert_runs",
    "pairs",
]


@lru_cache(maxsize=1)
def get_store() -> Store:
    """The store of the default database, chosen once: the database is fixed for the
    process (and ``django.db.connection`` is a thread-local proxy the hot path would
    otherwise ask several times per execution)."""
    if connection.vendor == "postgresql":
        return PostgreSQLStore()
    return PortableStore()
