from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import kombu
import pytest
from hypothesis import settings as hypothesis_settings

from schedapp.testing.fleet import RABBITMQ, Fleet, fleet_for
from schedapp.testing.pgproxy import PgProxy
from schedapp.testing.servers import PGBOUNCER, PgBouncer, PrivateRedis
from tests import APP, ROOT, SETTINGS, dbreset, dbtemplate

# Hypothesis profiles. "default", the loop of minutes: each property a quarter of its weight of
# examples (tests.examples(n): n/4 here; 25 for a property that names none). "ci", what .ci/run
# selects (HYPOTHESIS_PROFILE=ci): twenty times as many (five times the weight), no deadline (a
# loaded CI machine is not a slow property), and the blob that replays a failure printed with it.
hypothesis_settings.register_profile("default", max_examples=25)
hypothesis_settings.register_profile("ci", max_examples=500, deadline=None, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "default")


@pytest.fixture(autouse=True, scope="session")
def _the_portable_alias_answers_checks_without_a_query() -> None:
    """Django 6.1's system checks (which Celery's Django fixup runs as the app loads its task
    modules) ask every alias whether it supports JSONField; SQLite answers with a query, which
    pytest-django refuses outside a database test. The SQLite of every supported Python has
    JSON built in: the contract suite's ``portable`` alias says so without asking."""
    from django.db import connections

    if "portable" in connections:
        connections["portable"].features.supports_json_field = True


@pytest.fixture(autouse=True, scope="session")
def _test_databases_from_a_template() -> Iterator[None]:
    """The test databases are copied from the last run's when no migration changed
    (tests/dbtemplate.py: a fraction of a second instead of about 9 s of migrations)."""
    with dbtemplate.installed():
        yield


@pytest.fixture(autouse=True, scope="session")
def fast_reset() -> Iterator[dbreset.FastReset]:
    """Tests that commit are followed by deletes instead of Django's flush (tests/dbreset.py:
    the same state in a few milliseconds instead of 0.2 s)."""
    with dbreset.installed() as reset:
        yield reset


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
    through: Any = None,
) -> Iterator[Fleet]:
    """Real beats and workers on the test database; their logs are printed if the test failed.
    ``through`` (anything with ``host`` and ``port``: a PgBouncer, a proxy) is where their
    database connections go instead of the server."""
    from django.db import connection

    db = dict(connection.settings_dict)
    if through is not None:
        db.update(HOST=through.host, PORT=str(through.port))
    with fleet_for(tmp_path, db, url, extra_env, app=APP, cwd=ROOT, settings_module=SETTINGS) as f:
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
    """A fault-injecting proxy (schedapp.testing.pgproxy) in front of the test database's server.

    It needs no database access itself; route Django through it with
    ``schedapp.testing.pgproxy.django_through(pg_proxy)`` (under
    ``django_db(transaction=True)``), or a subprocess with
    ``DATABASE_URL=pg_proxy.database_url(url)``.
    """
    from django.conf import settings

    db = settings.DATABASES["default"]
    upstream = (db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    with PgProxy(upstream) as proxy:
        yield proxy


@pytest.fixture
def fleet_through(
    request: pytest.FixtureRequest, transactional_db: None, broker_url: str, tmp_path: Path
) -> Iterator[Callable[[Any], Fleet]]:
    """``fleet_through(endpoint)``: a fleet whose database connections go to ``endpoint`` (a
    PgBouncer, a proxy: anything with ``host`` and ``port``) instead of the server."""
    with ExitStack() as stack:
        yield lambda endpoint: stack.enter_context(
            _fleet(request, tmp_path, broker_url, through=endpoint)
        )


@pytest.fixture
def pgbouncer(request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own in transaction pooling mode, in front of the test
    database's server, for the test to ``start(pool_size, **settings)``; its log is printed if
    the test failed. Skipped without pgbouncer (Debian's package; .ci/run installs it)."""
    from django.conf import settings

    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
    db = settings.DATABASES["default"]
    upstream = (db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    bouncer = PgBouncer(upstream, user=db.get("USER") or "postgres")
    try:
        yield bouncer
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print("===== pgbouncer =====\n" + bouncer.log_text()[-6000:])
    finally:
        bouncer.stop()
