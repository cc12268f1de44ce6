"""Point a Django connection alias at a proxy for the duration of a ``with`` block.

Django is imported inside the function: the standalone proxy process never loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Endpoint(Protocol):
    host: str
    port: int


@contextmanager
def django_through(proxy: Endpoint, alias: str = "default") -> Iterator[Any]:
    """Route Django's ``alias`` connection through ``proxy``; yield that connection.

    The code under test uses ``django.db.connection`` itself, so the default alias is
    rerouted rather than a second one added: HOST/PORT of its settings dict are swapped and
    the connection closed on entry and on exit, so it reconnects through the proxy inside and
    directly after. The dict is shared by every thread's wrapper, so connections other threads
    open meanwhile go through the proxy too. Needs ``django_db(transaction=True)``: closing
    the connection would end a test-case transaction, and a cut COMMIT must really commit.
    """
    from django.db import connections

    conn = connections[alias]
    if conn.in_atomic_block:
        raise RuntimeError("django_through needs django_db(transaction=True)")
    saved = {key: conn.settings_dict.get(key) for key in ("HOST", "PORT")}
    _close(conn)
    conn.settings_dict.update(HOST=proxy.host, PORT=str(proxy.port))
    try:
        yield conn
    finally:
        _close(conn)
        conn.settings_dict.update(saved)


def _close(conn: Any) -> None:
    from django.db import DatabaseError

    try:
        conn.close()
    except DatabaseError:  # a connection the proxy cut may fail to close cleanly
        pass
