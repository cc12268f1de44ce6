from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet, fleet_for
from tests.pgproxy import PgProxy
from tests.servers import PrivateRedis


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow", action="store_true", default=False, help="also run long tests marked slow"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        # The suite on the portable store (project.settings_test_sqlite): what is about
        # PostgreSQL itself (its locks, plans, functions, wire protocol) is not run there.
        only_pg = pytest.mark.skip(reason="about PostgreSQL itself")
        for item in items:
            if "postgresql" in item.keywords:
                item.add_marker(only_pg)
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="long run: use --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def broker_url() -> str:
    """The tests' Redis database, emptied before each test that uses it."""
    import redis
    from django.conf import settings

    url = settings.CELERY_BROKER_URL
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A Redis server of the test's own, which it may stop and start (a broker outage)."""
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)


@pytest.fixture
def private_fleet(
    request: pytest.FixtureRequest,
    transactional_db: None,
    private_redis: PrivateRedis,
    tmp_path: Path,
) -> Iterator[Fleet]:
    """Real beats and workers whose broker is ``private_redis``."""
    from django.db import connection

    with fleet_for(tmp_path, connection.settings_dict, private_redis.url) as f:
        yield f
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(f.logs())


@pytest.fixture
def fleet(
    request: pytest.FixtureRequest, transactional_db: None, broker_url: str, tmp_path: Path
) -> Iterator[Fleet]:
    """Real beat and worker processes against the test database and Redis."""
    from django.db import connection

    with fleet_for(tmp_path, connection.settings_dict, broker_url) as f:
        yield f
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(f.logs())


@pytest.fixture
def pg_proxy() -> Iterator[PgProxy]:
    """A fault-injecting proxy (tests/pgproxy) in front of the test database's server.

    It needs no database access itself; route Django through it with
    ``tests.pgproxy.django_through(pg_proxy)`` (under ``django_db(transaction=True)``), or a
    subprocess with ``DATABASE_URL=pg_proxy.database_url(url)``.
    """
    from django.conf import settings

    db = settings.DATABASES["default"]
    upstream = (db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    with PgProxy(upstream) as proxy:
        yield proxy
