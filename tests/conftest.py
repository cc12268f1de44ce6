from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kombu
import pytest

from tests.fleet import RABBITMQ, Fleet, fleet_for
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


@contextmanager
def _fleet(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    url: str,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    """Real beats and workers on the test database; their logs are printed if the test failed."""
    from django.db import connection

    with fleet_for(tmp_path, connection.settings_dict, url, extra_env) as f:
        yield f
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(f.logs())


@pytest.fixture
def private_fleet(
    request: pytest.FixtureRequest,
    transactional_db: None,
    private_redis: PrivateRedis,
    tmp_path: Path,
) -> Iterator[Fleet]:
    """Real beats and workers whose broker is ``private_redis``."""
    with _fleet(request, tmp_path, private_redis.url) as f:
        yield f


@pytest.fixture
def fleet(
    request: pytest.FixtureRequest, transactional_db: None, broker_url: str, tmp_path: Path
) -> Iterator[Fleet]:
    """Real beat and worker processes against the test database and Redis."""
    with _fleet(request, tmp_path, broker_url) as f:
        yield f


@pytest.fixture(params=["redis", "rabbitmq"])
def fleet_on_each_broker(
    request: pytest.FixtureRequest, transactional_db: None, broker_url: str, tmp_path: Path
) -> Iterator[Fleet]:
    """The same fleet over Redis, then over the machine's RabbitMQ. RabbitMQ is shared and
    keeps its queues: the fleet's default queue is its own, and is deleted afterwards."""
    if request.param == "redis":
        with _fleet(request, tmp_path, broker_url) as f:
            yield f
        return
    queue = f"schedapp-test-{uuid.uuid4().hex[:10]}"
    try:
        with _fleet(request, tmp_path, RABBITMQ, {"PROJECT_DEFAULT_QUEUE": queue}) as f:
            yield f
    finally:
        with kombu.Connection(RABBITMQ) as conn:
            kombu.Queue(queue).bind(conn.default_channel).delete()


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
