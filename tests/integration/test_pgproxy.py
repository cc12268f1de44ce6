"""The fault-injecting PostgreSQL proxy (schedapp.testing.pgproxy) against the real server.

Plain psycopg connections to the ``postgres`` database, except the Django test at the end;
the probe table is named per process so parallel runs cannot collide.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from schedapp.testing.pgproxy import PgProxy, django_through, spawn_proxy
from schedapp.testing.pgproxy.connection import Connection
from tests.claiming import in_thread

TABLE = f"pgproxy_probe_{os.getpid()}"


def conninfo(host: str | None = None, port: int | None = None, **extra: Any) -> str:
    db = settings.DATABASES["default"]
    params = {
        "host": host or db.get("HOST") or "127.0.0.1",
        "port": port or db.get("PORT") or 5432,
        "user": db.get("USER") or "postgres",
        "password": db.get("PASSWORD") or "",
        "dbname": "postgres",
        "connect_timeout": 10,
        **extra,
    }
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v != ""})


def via(proxy: Any, autocommit: bool = False, **extra: Any) -> psycopg.Connection:
    """A psycopg connection through ``proxy`` (a PgProxy or a ProxyControl)."""
    return psycopg.connect(conninfo(proxy.host, proxy.port, **extra), autocommit=autocommit)


def committed(marker: str) -> bool:
    """Whether a row with ``marker`` is there, seen on a direct connection (no proxy)."""
    with psycopg.connect(conninfo()) as direct:
        row = direct.execute(f"SELECT count(*) FROM {TABLE} WHERE marker = %s", (marker,))
        return row.fetchone() == (1,)


def raw_session(proxy: PgProxy) -> socket.socket:
    """A hand-driven protocol session (psycopg cannot send a batch before the last's reply)."""
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    user = settings.DATABASES["default"].get("USER") or "postgres"
    body = struct.pack("!I", 196608) + f"user\0{user}\0database\0postgres\0\0".encode()
    sock.sendall(struct.pack("!I", len(body) + 4) + body)
    messages = read_messages(sock, until=b"Z")
    if (b"R", struct.pack("!I", 0)) not in messages:
        sock.close()
        pytest.skip("raw session needs trust authentication")
    return sock


def read_messages(sock: socket.socket, until: bytes | None = None) -> list[tuple[bytes, bytes]]:
    """Messages read until one of type ``until`` (included), or until the peer closes."""
    stream = sock.makefile("rb")
    messages = []
    while (head := stream.read(5)) and len(head) == 5:
        mtype, length = head[:1], struct.unpack("!I", head[1:])[0]
        messages.append((mtype, stream.read(length - 4)))
        if mtype == until:
            break
    return messages


def simple_query(sql: str) -> bytes:
    body = sql.encode() + b"\0"
    return b"Q" + struct.pack("!I", len(body) + 4) + body


def round_trip(conn: psycopg.Connection) -> float:
    started = time.monotonic()
    assert conn.execute("SELECT 1").fetchone() == (1,)
    return time.monotonic() - started


# The faults that last a set time (1-1.6 s each) run with the long tail (CI's second tier,
# where the e2e outage tests use them too); the default run keeps the proxy's forwarding,
# cuts, resets and control socket.
TIMED = pytest.mark.exhaustive


@pytest.fixture(scope="module", autouse=True)
def probe_table() -> Iterator[None]:
    with psycopg.connect(conninfo(), autocommit=True) as direct:
        direct.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id serial PRIMARY KEY, marker text)")
        yield
        direct.execute(f"DROP TABLE IF EXISTS {TABLE}")


def test_forwards_many_statements_on_concurrent_connections(pg_proxy: PgProxy) -> None:
    # Given 6 connections through the proxy, each running simple and extended-protocol
    # queries, a 2 MB value (a message spanning many reads) and a COPY, all at once
    def work(n: int) -> int:
        with via(pg_proxy, application_name=f"client-{n}") as conn:
            for i in range(150):
                assert conn.execute("SELECT %s::int * 2", (i,)).fetchone() == (2 * i,)
                assert conn.execute(f"SELECT {i} + {n}").fetchone() == (i + n,)
            big = conn.execute("SELECT repeat('x', 2000000)").fetchone()
            assert big is not None and big[0] == "x" * 2_000_000
            with conn.cursor().copy("COPY (SELECT generate_series(1, 5000)) TO STDOUT") as copy:
                rows = sum(1 for _ in copy.rows())
            assert rows == 5000
            return n

    threads = [in_thread(functools.partial(work, n)) for n in range(6)]
    for thread, _ in threads:
        thread.join(60)

    # Then every one finished with the right answers
    assert [out.get("error") for _, out in threads] == [None] * 6
    assert sorted(out["value"] for _, out in threads) == list(range(6))
    assert pg_proxy.stats()["connections"] == 6


def test_encryption_requests_are_refused_and_startup_goes_on_in_plain_text(
    pg_proxy: PgProxy,
) -> None:
    # Given a raw client asking for GSS then SSL encryption before its StartupMessage
    with socket.create_connection((pg_proxy.host, pg_proxy.port), timeout=10) as sock:
        sock.sendall(struct.pack("!II", 8, 80877104))
        assert sock.recv(1) == b"N"
        sock.sendall(struct.pack("!II", 8, 80877103))
        assert sock.recv(1) == b"N"
        # When it sends the StartupMessage in plain text
        body = struct.pack("!I", 196608) + b"user\0postgres\0database\0postgres\0\0"
        sock.sendall(struct.pack("!I", len(body) + 4) + body)
        # Then the server's authentication reply comes back through the proxy
        assert sock.recv(1) == b"R"
    # And a client that insists on TLS is told the server has none
    with pytest.raises(psycopg.OperationalError, match="SSL"):
        via(pg_proxy, sslmode="require")


def test_cancel_requests_reach_the_server(pg_proxy: PgProxy) -> None:
    with via(pg_proxy, autocommit=True) as conn:
        # Given a long statement running through the proxy
        stmt, out = in_thread(lambda: conn.execute("SELECT pg_sleep(30)"))
        time.sleep(0.5)
        # When the client cancels it (a CancelRequest on a connection of its own)
        conn.cancel_safe(timeout=10)
        stmt.join(10)
        # Then the server cancelled it
        assert isinstance(out.get("error"), psycopg.errors.QueryCanceled), out
        assert round_trip(conn) < 1.0


def test_cut_after_commit_the_transaction_commits_and_the_client_sees_a_broken_connection(
    pg_proxy: PgProxy,
) -> None:
    marker = f"commit-{uuid.uuid4().hex}"
    with via(pg_proxy) as conn:
        pg_proxy.cut_after()  # the COMMIT statement (not this INSERT of 'commit-...')
        # Given an open transaction that inserted a row
        conn.execute(f"INSERT INTO {TABLE} (marker) VALUES ('{marker}')")
        # When it commits through a proxy that loses the reply
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
        assert conn.closed
    # Then the row is committed all the same
    assert committed(marker)
    # And the cut is recorded with what psycopg sent and what the client never saw
    [event] = [e for e in pg_proxy.events() if e["kind"] == "cut"]
    assert (event["statement"], event["reply"]) == ("Q: COMMIT", ["COMMIT"])
    assert pg_proxy.stats()["cuts"] == 1
    # And a cut fires `times` times only: the next COMMIT goes through
    with via(pg_proxy) as conn:
        conn.execute(f"INSERT INTO {TABLE} (marker) VALUES ('after-cut')")
        conn.commit()
    assert pg_proxy.stats()["cuts"] == 1


def test_a_bytes_pattern_matches_anywhere_in_the_text_literal_values_included(
    pg_proxy: PgProxy,
) -> None:
    # Django's default cursor inlines parameters into the query text, as this INSERT does
    marker = f"commit-{uuid.uuid4().hex}"
    with via(pg_proxy) as conn:
        pg_proxy.cut_after(b"COMMIT")
        with pytest.raises(psycopg.OperationalError):
            conn.execute(f"INSERT INTO {TABLE} (marker) VALUES ('{marker}')")
    # The INSERT was cut, not the COMMIT (never sent): its transaction was rolled back
    assert not committed(marker)
    [event] = pg_proxy.events()
    assert event["statement"].startswith("Q: INSERT INTO")


def test_cut_after_an_autocommit_statement_matched_by_a_fragment(pg_proxy: PgProxy) -> None:
    marker = uuid.uuid4().hex
    with via(pg_proxy, autocommit=True) as conn:
        # Given earlier traffic on the same connection (its replies must still arrive)
        assert round_trip(conn) >= 0
        pg_proxy.cut_after(f"insert into {TABLE}".encode())  # case-insensitive
        # When a parameterised INSERT (Parse/Bind/Execute/Sync) runs
        with pytest.raises(psycopg.OperationalError):
            conn.execute(f"INSERT INTO {TABLE} (marker) VALUES (%s)", (marker,))
    # Then the row is there though the client saw an error
    assert committed(marker)
    [event] = pg_proxy.events()
    assert event["statement"].startswith("P: INSERT INTO") and event["reply"] == ["INSERT 0 1"]


def test_cut_delivers_the_replies_owed_to_earlier_statements_and_drops_only_its_own(
    pg_proxy: PgProxy,
) -> None:
    marker = uuid.uuid4().hex
    with raw_session(pg_proxy) as sock:
        pg_proxy.cut_after(marker.encode())
        # Given a slow query and, pipelined behind it in the same write, the matching insert
        sock.sendall(
            simple_query("SELECT pg_sleep(0.2), 7")
            + simple_query(f"INSERT INTO {TABLE} (marker) VALUES ('{marker}')")
        )
        # Then the client gets the first reply whole, then the connection closes
        messages = read_messages(sock)
    assert [t for t, _ in messages] == [b"T", b"D", b"C", b"Z"]
    assert messages[2][1] == b"SELECT 1\0"
    # And the insert ran; only its reply was lost
    assert committed(marker)
    assert pg_proxy.events()[0]["reply"] == ["INSERT 0 1"]


def test_cut_matches_a_prepared_statement_executed_by_name_only(pg_proxy: PgProxy) -> None:
    query = f"INSERT INTO {TABLE} (marker) VALUES (%s)"
    marker = uuid.uuid4().hex
    with via(pg_proxy, autocommit=True) as conn:
        # Given a statement prepared on the server (later runs send Bind, not its text)
        conn.execute(query, ("prepared-0",), prepare=True)
        pg_proxy.cut_after(b"INTO " + TABLE.encode())
        # When it runs again by name
        with pytest.raises(psycopg.OperationalError):
            conn.execute(query, (marker,), prepare=True)
    # Then that run was the one cut
    assert committed(marker)
    [event] = pg_proxy.events()
    assert event["statement"].startswith("B: INSERT INTO")


def test_cut_only_hits_connections_of_the_named_application(
    pg_proxy: PgProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg_proxy.cut_after(app="worker-*")
    # Given a beat's connection and a worker's, both committing
    with via(pg_proxy, application_name="beat-1") as beat:
        beat.execute("SELECT 1")
        beat.commit()  # not a worker: goes through
    # (named as a subprocess would be: PGAPPNAME in its environment)
    monkeypatch.setenv("PGAPPNAME", "worker-2")
    with via(pg_proxy) as worker:
        worker.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            worker.commit()
    [event] = pg_proxy.events()
    assert event["app"] == "worker-2"


@TIMED
def test_delay_adds_latency_per_round_trip_until_its_duration_ends(pg_proxy: PgProxy) -> None:
    with via(pg_proxy, autocommit=True) as conn:
        round_trip(conn)
        # Given a 0.25 s delay for the next 1.5 s
        pg_proxy.delay(0.25, duration=1.5)
        # Then each round trip takes at least that long
        slow = [round_trip(conn) for _ in range(3)]
        assert min(slow) >= 0.25, slow
        # And once the duration is over, round trips are fast again
        time.sleep(max(0.0, 1.6 - sum(slow)))
        fast = [round_trip(conn) for _ in range(5)]
        assert min(fast) < 0.15, fast
    assert pg_proxy.stats()["delayed"] >= 3


@TIMED
def test_stall_after_stops_the_client_right_after_its_statement_with_its_locks_held(
    pg_proxy: PgProxy,
) -> None:
    marker = uuid.uuid4().hex
    with via(pg_proxy) as stalled, psycopg.connect(conninfo(), autocommit=True) as direct:
        direct.execute(f"INSERT INTO {TABLE} (marker) VALUES (%s)", (marker,))
        # Given a 1.5 s stall after the next statement that locks the probe rows
        pg_proxy.stall_after(b"for update", 1.5)
        stalled.execute(f"SELECT id FROM {TABLE} WHERE marker = %s FOR UPDATE", (marker,))
        # Then its reply came back, but its next statement (the COMMIT) waits for the stall:
        thread, out = in_thread(stalled.commit)
        time.sleep(0.5)
        assert thread.is_alive()
        # meanwhile the row lock is still held in the server (the transaction is open)
        locked = direct.execute(
            f"SELECT id FROM {TABLE} WHERE marker = %s FOR UPDATE SKIP LOCKED", (marker,)
        ).fetchall()
        assert locked == []
        thread.join(10)
        assert "error" not in out
    (event,) = [e for e in pg_proxy.events() if e["kind"] == "stall"]
    assert event["seconds"] == 1.5 and "FOR UPDATE" in event["statement"]
    assert pg_proxy.stats()["stalls"] == 1


@TIMED
def test_blackhole_hangs_a_statement_and_new_connections_until_it_ends(pg_proxy: PgProxy) -> None:
    with via(pg_proxy, autocommit=True) as conn:
        round_trip(conn)
        # Given a 1.5 s partition
        armed = time.monotonic()
        pg_proxy.blackhole(1.5)
        # When a statement runs on an open connection, and a new connection is opened
        stmt, stmt_out = in_thread(lambda: conn.execute("SELECT 42").fetchone())
        fresh, fresh_out = in_thread(lambda: via(pg_proxy).close())
        # Then both hang while it lasts...
        stmt.join(0.8)
        assert stmt.is_alive() and fresh.is_alive()
        # ...and succeed once it ends, with the connection still usable
        stmt.join(10)
        fresh.join(10)
        assert stmt_out.get("value") == (42,), stmt_out
        assert "error" not in fresh_out, fresh_out
        assert min(stmt_out["finished"], fresh_out["finished"]) - armed >= 1.5
        assert round_trip(conn) < 1.0
    assert pg_proxy.stats()["held"] >= 2


@TIMED
def test_cut_then_down_refuses_new_connections_at_once_until_it_ends(pg_proxy: PgProxy) -> None:
    marker = uuid.uuid4().hex
    with via(pg_proxy, autocommit=True) as conn, via(pg_proxy, autocommit=True) as other:
        round_trip(other)
        # Given a cut that then takes the database down for 1.5 s
        pg_proxy.cut_after(f"insert into {TABLE}".encode(), down=1.5)
        # When the statement runs: it commits, its client sees a broken connection
        with pytest.raises(psycopg.OperationalError):
            conn.execute(f"INSERT INTO {TABLE} (marker) VALUES (%s)", (marker,))
        # Then the other open connection is closed too, and a new one is refused at once
        with pytest.raises(psycopg.OperationalError):
            round_trip(other)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="the database is down"):
            via(pg_proxy).close()
        assert time.monotonic() - started < 1.0
    assert committed(marker)
    # ...until its end: then connections are served again
    time.sleep(1.6)
    with via(pg_proxy) as conn:
        assert round_trip(conn) < 1.0


@TIMED
def test_a_silent_cut_leaves_the_client_waiting_without_a_reply_or_a_reset(
    pg_proxy: PgProxy,
) -> None:
    marker = uuid.uuid4().hex
    conn = via(pg_proxy, autocommit=True)
    # Given a silent cut after an INSERT
    pg_proxy.cut_after(f"insert into {TABLE}".encode(), silent=True)
    # When the statement runs
    stmt, out = in_thread(
        lambda: conn.execute(f"INSERT INTO {TABLE} (marker) VALUES (%s)", (marker,))
    )
    # Then it committed, but its client waits: no reply, no reset, even once the server
    # side is gone (here: once the server ended that session)
    wait_for = time.monotonic() + 10
    while not committed(marker):
        assert time.monotonic() < wait_for
        time.sleep(0.05)
    with psycopg.connect(conninfo(), autocommit=True) as direct:
        direct.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE %s "
            "AND pid <> pg_backend_pid()",
            (f"INSERT INTO {TABLE}%",),
        )
    stmt.join(1.5)
    assert stmt.is_alive()
    [event] = pg_proxy.events()
    assert event["silent"] and event["reply"] == ["INSERT 0 1"]
    # ...until it closes the connection itself
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # as schedapp's watchdog does
        sock.shutdown(socket.SHUT_RDWR)
    stmt.join(10)
    assert isinstance(out.get("error"), psycopg.OperationalError), out
    conn.close()


@TIMED
def test_blackhole_with_reset_closes_the_connections_at_its_end(pg_proxy: PgProxy) -> None:
    with via(pg_proxy, autocommit=True) as conn, via(pg_proxy, autocommit=True) as idle:
        round_trip(conn)
        round_trip(idle)
        # Given a partition that ends like a NAT dropping its state
        armed = time.monotonic()
        pg_proxy.blackhole(1.0, reset=True)
        # When a statement runs during it
        stmt, out = in_thread(lambda: conn.execute("SELECT 1").fetchone())
        stmt.join(10)
        # Then it hangs until the end, and fails then, as does the idle connection
        assert isinstance(out.get("error"), psycopg.OperationalError), out
        assert out["finished"] - armed >= 1.0
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
    assert pg_proxy.stats()["resets"] == 2
    # And traffic flows again for new connections
    with via(pg_proxy) as conn:
        round_trip(conn)


def test_a_connection_marked_closed_forwards_nothing_before_its_sockets_shut(
    pg_proxy: PgProxy,
) -> None:
    # Given a connection a partition's end has marked closed, its sockets not shut yet (the
    # window while the proxy closes the victims one by one; CI once ran a statement in it)
    with via(pg_proxy, autocommit=True) as conn:
        round_trip(conn)
        [proxied] = pg_proxy._snapshot()
        with pg_proxy._cond:
            proxied.closed = True
        # When the client sends a statement then
        stmt, out = in_thread(lambda: conn.execute("SELECT 1").fetchone())
        stmt.join(0.5)
        # Then it is not forwarded: no answer comes before the connection is shut
        assert "value" not in out, out
        proxied.close()
        stmt.join(10)
        assert isinstance(out.get("error"), psycopg.OperationalError), out


def test_a_reset_marks_every_victim_closed_before_it_shuts_any(
    pg_proxy: PgProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two open connections (CI once saw the second answer a statement sent in the
    # moment after the first was shut, before the reset reached the second)
    with via(pg_proxy, autocommit=True) as a, via(pg_proxy, autocommit=True) as b:
        round_trip(a)
        round_trip(b)
        proxied = pg_proxy._snapshot()
        seen: list[list[bool]] = []
        shut = Connection.close

        def close(self: Connection) -> None:
            seen.append([c.closed for c in proxied])
            shut(self)

        monkeypatch.setattr(Connection, "close", close)
        # When the database goes down for them
        pg_proxy.down(1.0)
    # Then both were marked closed (forwarding nothing) before the first was shut
    assert seen and seen[0] == [True, True]


def test_reset_all_breaks_open_connections_and_clear_disarms(pg_proxy: PgProxy) -> None:
    with via(pg_proxy, autocommit=True) as conn:
        round_trip(conn)
        assert pg_proxy.reset_all() == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    pg_proxy.cut_after()
    pg_proxy.delay(5.0)
    pg_proxy.blackhole(None)
    pg_proxy.clear()
    with via(pg_proxy) as conn:
        assert round_trip(conn) < 1.0
        conn.commit()
    assert pg_proxy.stats()["cuts"] == 0


def test_database_url_points_a_url_at_the_proxy(pg_proxy: PgProxy) -> None:
    url = "postgresql://app:s3cret@db.example:6432/test_x?sslmode=disable"
    expected = f"postgresql://app:s3cret@{pg_proxy.host}:{pg_proxy.port}/test_x?sslmode=disable"
    assert pg_proxy.database_url(url) == expected


def test_standalone_process_is_steered_through_its_control_socket(tmp_path: Path) -> None:
    db = settings.DATABASES["default"]
    upstream = (db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    marker = uuid.uuid4().hex
    # Given a proxy in its own process
    with spawn_proxy(tmp_path / "ctl.sock", upstream) as ctl:
        assert ctl.process is not None and ctl.process.pid != os.getpid()
        with via(ctl, autocommit=True) as conn:
            round_trip(conn)
            # When this process arms a cut through the control socket
            ctl.cut_after(marker.encode())
            with pytest.raises(psycopg.OperationalError):
                conn.execute(f"INSERT INTO {TABLE} (marker) VALUES ('{marker}')")
        # Then the statement landed, and the proxy's counters and events say so
        assert committed(marker)
        stats = ctl.stats()
        assert (stats["connections"], stats["cuts"]) == (1, 1)
        assert [e["kind"] for e in ctl.events()] == ["cut"]
        # And the default pattern (a regex) crosses the channel too
        ctl.cut_after()
        with via(ctl) as conn:
            conn.execute(f"INSERT INTO {TABLE} (marker) VALUES ('{marker}-2')")
            with pytest.raises(psycopg.OperationalError):
                conn.commit()
        assert committed(f"{marker}-2")
        assert ctl.events(since=1)[0]["statement"] == "Q: COMMIT"
        # And a delay set from here applies there
        ctl.delay(0.3, duration=5)
        with via(ctl, autocommit=True) as conn:
            assert round_trip(conn) >= 0.3
        ctl.clear()
        # And a bad request is refused with its reason, the proxy going on
        with pytest.raises(RuntimeError, match="unknown operation"):
            ctl.call("shutdown")
        assert ctl.stats()["connections"] == 3
    assert ctl.process.returncode is not None


@pytest.mark.django_db(transaction=True)
def test_django_atomic_commit_cut_raises_but_the_data_is_committed(pg_proxy: PgProxy) -> None:
    from django.db import InterfaceError, OperationalError, connection, connections, transaction
    from django.utils import timezone

    from project.models import Execution

    direct = (connection.settings_dict["HOST"], connection.settings_dict["PORT"])
    # Given Django's default connection routed through the proxy, and a cut armed
    with django_through(pg_proxy) as conn:
        assert conn is connections["default"]
        pg_proxy.cut_after()
        # When an atomic block commits
        with pytest.raises((OperationalError, InterfaceError)):
            with transaction.atomic():
                Execution.objects.create(label="cut-commit", started_at=timezone.now())
    # Then Django raised, but the row is there, read over the restored direct connection
    assert (connection.settings_dict["HOST"], connection.settings_dict["PORT"]) == direct
    assert Execution.objects.filter(label="cut-commit").count() == 1
    [event] = pg_proxy.events()
    assert (event["statement"], event["reply"]) == ("Q: COMMIT", ["COMMIT"])
