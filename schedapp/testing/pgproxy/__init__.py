"""A fault-injecting proxy for the PostgreSQL wire protocol, for tests and the chaos harness.

In a test (a thread of the test process)::

    with PgProxy(upstream=("127.0.0.1", 5432)) as proxy:     # or the pg_proxy fixture
        proxy.cut_after()                   # next COMMIT lands, its reply is lost
        with django_through(proxy):         # Django's default connection goes through it
            ...

In another process: ``python -m schedapp.testing.pgproxy --listen 127.0.0.1:0 --upstream
127.0.0.1:5432 --control /tmp/p.sock`` (or ``spawn_proxy(path)``), steered with
``ProxyControl(path)``, which has the same fault methods. A subprocess reaches it through
``DATABASE_URL=proxy.database_url(url)``; ``PGAPPNAME=worker-1`` in its environment names its
connections so a fault can target it with ``app="worker-*"``.
"""

from __future__ import annotations

from .control import ControlServer, ProxyControl, spawn_proxy
from .djangodb import django_through
from .proxy import COMMIT, PgProxy, with_address

__all__ = [
    "COMMIT",
    "ControlServer",
    "PgProxy",
    "ProxyControl",
    "django_through",
    "spawn_proxy",
    "with_address",
]
