"""The PostgreSQL store: each operation one statement of ``sql/queries.sql`` (the worker's hot
ones through the PL/pgSQL functions of ``sql/functions.sql``, on a plain psycopg cursor),
LISTEN/NOTIFY to wake beats, and COPY for bulk scheduling (``insert_jobs``, rows encoded by
``schedapp.copyrows``). Bound to one database alias: every statement goes through that
alias's connection."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Q

from ..copyrows import COPY_COLUMNS, ENCODERS, CopyRows
from ..models import Job
from ..sql import query
from .base import ClaimProbe, DoorVerdict, InsertedJobs, NameTaken

try:  # PostgreSQL's driver: an extra (schedapp[postgres]); SQLite needs none
    import psycopg
except ImportError:  # pragma: no cover - exercised by the packaging check
    psycopg = None  # type: ignore[assignment]

log = logging.getLogger("schedapp.beat")  # the listener is a beat's: its lines are too

NOTIFY_CHANNEL = "schedapp"
_NAME_CONSTRAINT = "schedapp_job_name_unique"
_LINES_PER_WRITE = 256  # COPY lines joined per write: fewer calls, data still streaming
# Django 6.1 renamed savepoint() to savepoint_create(); the old name warns.
_savepoint = getattr(transaction, "savepoint_create", transaction.savepoint)
# How long a new listener waits for a test notification before concluding that none reach it.
PROBE_SECONDS = 1.0


class NotificationsNotDelivered(Exception):
    """A notification sent from another connection never reached the listener's."""


class PostgreSQLStore:
    name = "postgresql"
    copies_rows = True

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using  # the database alias every statement goes through
        self._undelivered: set[str] = set()  # where notifications were found not to arrive

    def now(self) -> datetime:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("now"))
            value = cursor.fetchone()[0]
        return value.astimezone(UTC)

    def claim(
        self, beat: str, limit: int, ids: list[int] | None = None
    ) -> tuple[list[dict], datetime | None]:
        # The statement reads now() itself.
        with connections[self.using].cursor() as cursor:
            if ids is None:
                cursor.execute(query("claim_due_jobs"), {"limit": limit, "beat": beat})
            else:
                cursor.execute(query("claim_job_ids"), {"ids": ids, "beat": beat})
            names = [c.name for c in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return rows, None

    def due_ids(self, limit: int) -> list[int]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("due_ids"), {"limit": limit})
            return [job_id for (job_id,) in cursor.fetchall()]

    def restamp_leases(self, job_ids: list[int]) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("restamp_leases"), [job_ids])

    def next_due(self) -> tuple[datetime, datetime | None, datetime | None]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("next_due"))
            now, next_due, next_expiry = cursor.fetchone()
        return now, next_due, next_expiry

    def admit(
        self, job_id: int, token: int, worker: str, admission: str, run_id: int | None = None
    ) -> DoorVerdict:
        ((verdict,),) = call_function(
            query("admit_run"), [job_id, token, worker, admission, run_id], self.using
        )
        return DoorVerdict(verdict)

    def renew(
        self, held: Sequence[tuple[int, int]], run_ids: Mapping[tuple[int, int], int] | None = None
    ) -> list[tuple[int, int, str]]:
        runs = [(run_ids or {}).get(key) for key in held]
        return call_function(  # type: ignore[return-value]
            query("renew_leases"), [[j for j, _ in held], [t for _, t in held], runs], self.using
        )

    def succeed_run(self, args: list[Any]) -> bool:
        ((applied,),) = call_function(query("succeed_run"), args, self.using)
        return bool(applied)

    def succeed_runs(self, columns: list[list[Any]]) -> list[tuple[int, bool]]:
        return call_function(  # type: ignore[return-value]
            query("succeed_runs"), columns, self.using
        )

    def succeed_and_admit(
        self,
        columns: list[list[Any]],
        job_id: int,
        token: int,
        worker: str,
        admission: str,
        run_id: int | None = None,
    ) -> tuple[list[tuple[int, bool]], DoorVerdict]:
        if not columns:
            return [], self.admit(job_id, token, worker, admission, run_id)
        if len(columns[0]) == 1:  # the common case, without arrays
            ((ok, verdict),) = call_function(
                query("succeed_run_then_admit"),
                [*(col[0] for col in columns), job_id, token, worker, admission, run_id],
                self.using,
            )
            return [(1, bool(ok))], DoorVerdict(verdict)
        ((applied, verdict),) = call_function(
            query("succeed_runs_then_admit"),
            [*columns, job_id, token, worker, admission, run_id],
            self.using,
        )
        return [(idx, True) for idx in applied], DoorVerdict(verdict)

    def notify(self, when: datetime | None, delay_seconds: float | None) -> None:
        with connections[self.using].cursor() as cursor:
            if when is not None:
                cursor.execute(query("notify_at"), [NOTIFY_CHANNEL, f"{when.timestamp():.6f}"])
            else:
                cursor.execute(query("notify_after"), [NOTIFY_CHANNEL, float(delay_seconds or 0.0)])

    def listen(self) -> PgListener | None:
        """A listener, or None: the beat polls every second. Where notifications were found
        not to arrive (through a transaction-pooling PgBouncer) it is not tried again: the
        path to the database does not change while the process lives."""
        where = self.label()
        if where in self._undelivered:
            return None
        try:
            return PgListener.open(self.using)
        except NotificationsNotDelivered:
            self._undelivered.add(where)
            log.warning(
                "no notification reaches this beat through %s (a transaction-pooling PgBouncer "
                "passes none to a client between its transactions): it looks for new jobs "
                "every second instead of listening",
                where,
                extra={"action": "listen_undelivered"},
            )
            return None

    def limit_idle_transaction(self, seconds: float) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("idle_transaction_timeout"), [_idle_limit(seconds)])

    def begin_claim(self, seconds: float) -> ClaimProbe:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("claim_probe"), [_idle_limit(seconds)])
            _, jobs, runs, retries = cursor.fetchone()
        return ClaimProbe(bool(jobs), bool(runs), bool(retries))

    def lock(self, key: int) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("advisory_lock"), [key])

    def backlog(self, cap: int) -> tuple[int, datetime | None]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("backlog"), {"cap": cap})
            due, oldest = cursor.fetchone()
        return int(due), oldest

    def dispatch_lag(self, minutes: int, sample: int) -> list[tuple[Any, ...]]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("dispatch_lag"), {"sample": sample, "minutes": minutes})
            return cursor.fetchall()

    def recent_statuses(self, minutes: int, sample: int) -> dict[str, int]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("recent_statuses"), {"sample": sample, "minutes": minutes})
            return {status: int(count) for status, count in cursor.fetchall()}

    def label(self) -> str:
        settings = connections[self.using].settings_dict
        host = settings.get("HOST") or "localhost"
        port = settings.get("PORT") or 5432
        return f"postgresql://{host}:{port}/{settings.get('NAME')}"

    def job_rows(self, now: datetime, copy_format: str) -> CopyRows:
        return ENCODERS[copy_format](now)

    def insert_jobs(self, encoder: CopyRows, rows: Iterable[Any]) -> InsertedJobs:
        """``COPY`` the rows into the table in a savepoint, streaming: PostgreSQL stores the
        rows sent while the caller builds the next ones (``rows`` may be a generator). The
        unique index on names finds duplicates at no extra cost; a refusal rolls the
        savepoint back."""
        import psycopg  # this path is PostgreSQL's, which needs schedapp[postgres]

        db = connections[self.using]
        quote = db.ops.quote_name
        columns = ", ".join(quote(c) for c in COPY_COLUMNS)
        sql = f"COPY {quote(Job._meta.db_table)} ({columns}) FROM STDIN (FORMAT {encoder.format})"
        savepoint = _savepoint(using=self.using)
        try:
            with db.cursor() as cursor, cursor.cursor.copy(sql) as copy:
                join = encoder.join
                lines: list[Any] = [encoder.header]
                for row in rows:
                    lines.append(row)
                    if len(lines) >= _LINES_PER_WRITE:
                        copy.write(join(lines))
                        lines.clear()
                lines.append(encoder.trailer)
                copy.write(join(lines))
        except psycopg.errors.UniqueViolation as exc:
            transaction.savepoint_rollback(savepoint, using=self.using)
            if exc.diag.constraint_name == _NAME_CONSTRAINT:
                raise NameTaken from exc
            raise ValidationError({"__all__": [f"the database refused the jobs: {exc}"]}) from exc
        except psycopg.errors.IntegrityError as exc:
            transaction.savepoint_rollback(savepoint, using=self.using)
            raise ValidationError({"__all__": [f"the database refused the jobs: {exc}"]}) from exc
        transaction.savepoint_commit(savepoint, using=self.using)
        # The last id this session drew is the batch's last job: COPY draws ids in row order.
        with db.cursor() as cursor:
            cursor.execute(query("bulk_last_row"))
            last_id, xid = cursor.fetchone()
        return InsertedJobs(last_id=last_id, xid=xid)

    def jobs_named(self, names: list[str]) -> dict[str, tuple[int, str]]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("bulk_names_taken"), [names])
            return {name: (job_id, xid) for name, job_id, xid in cursor.fetchall()}

    def tagged(self, tag: str) -> Q:
        # jsonb @>, served by the partial GIN index of tagged jobs (migration 0026), whose
        # condition the second term states so that the planner may use it
        return Q(tags__contains=[tag]) & ~Q(tags=[])

    def record_created(self, names: list[str], *, source: str, actor: str, reason: str) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("audit_created"), [source, actor, reason, names])

    def inserted_from(self, job_id: int, inserted: InsertedJobs) -> int:
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("bulk_rows_of_chunk"), [job_id, inserted.last_id, inserted.xid])
            (from_here_on,) = cursor.fetchone()
        return int(from_here_on)


def _idle_limit(seconds: float) -> str:
    """``idle_in_transaction_session_timeout``'s value for ``seconds`` (set_config takes text)."""
    return f"{int(seconds * 1000)}ms"


def call_function(
    sql: str, params: Sequence[Any], using: str = DEFAULT_DB_ALIAS
) -> list[tuple[Any, ...]]:
    """Run one of schedapp's hot statements (a PL/pgSQL function call) on Django's connection,
    through a plain psycopg cursor kept per connection: the worker makes two such calls per
    execution, and Django's cursor wrapper would cost more than the call itself. Errors are
    Django's, as from any other query (``with_retries`` reconnects on them).

    Never prepared, whatever ``OPTIONS["prepare_threshold"]`` says: Django's own statements
    (client-side binding) never are, and this cursor binds on the server, so psycopg would
    prepare these calls where Django prepares nothing, and a transaction-pooling PgBouncer
    without prepared-statement support (before 1.21) would hand the named statement of one
    client to another. The functions' own statements are planned once per session anyway."""
    db = connections[using]  # one thread-local lookup, then plain attributes
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        cursor = getattr(raw, _HOT_CURSOR, None)
        if cursor is None or cursor.closed:
            cursor = psycopg.Cursor(raw)
            setattr(raw, _HOT_CURSOR, cursor)
        cursor.execute(sql, params, prepare=False)
        return cursor.fetchall()


# The attribute of a psycopg connection that keeps its plain cursor: the cursor lives and dies
# with its connection. (A WeakKeyDictionary cannot hold it: its value, the cursor, refers to its
# key, so every connection a worker ever opened stayed alive, one more per reconnect.)
_HOT_CURSOR = "_schedapp_hot_cursor"


class PgListener:
    """A dedicated PostgreSQL connection LISTENing for ``schedapp`` notifications."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @classmethod
    def open(cls, using: str = DEFAULT_DB_ALIAS) -> PgListener | None:
        """Connected exactly as Django connects (TLS, certificates, ``options``, service
        files: every ``OPTIONS`` entry), autocommit, LISTENing once a test notification
        reached it. None if it could not connect (the beat polls, and tries again later);
        NotificationsNotDelivered if notifications do not reach it (it never LISTENed)."""
        conn: Any = None
        try:
            params = connections[using].get_connection_params()
            params.setdefault("connect_timeout", 5)
            params["autocommit"] = True
            conn = psycopg.connect(**params)
            if _notification_arrives(conn, params):
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                return cls(conn)
        except Exception as exc:  # fall back to polling
            log.warning(
                "cannot LISTEN for new jobs (%s); polling instead",
                exc,
                extra={"action": "listen_failed"},
            )
            if conn is not None:
                conn.close()
            return None
        conn.close()
        raise NotificationsNotDelivered

    def wait(self, timeout: float, wake_at_db: float | None) -> bool | None:
        """Sleep up to ``timeout``; True if woken by a job due before ``wake_at_db``.

        Returns None if the connection broke (the caller sleeps the rest without it).
        """
        deadline = time.monotonic() + timeout
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                # Close each generator before the next: a suspended one holds the lock.
                with closing(self.conn.notifies(timeout=remaining, stop_after=1)) as notes:
                    woken = any(wake_at_db is None or _due(n.payload) <= wake_at_db for n in notes)
                if woken:
                    self._drain()
                    return True
            return False
        except Exception as exc:
            log.warning("notification connection lost: %s", exc, extra={"action": "listen_lost"})
            self.close()
            return None

    def _drain(self) -> None:
        """Consume notifications already received: one wake-up serves them all."""
        with closing(self.conn.notifies(timeout=0.001, stop_after=100_000)) as notes:
            for _ in notes:
                pass

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def _notification_arrives(conn: Any, params: dict[str, Any]) -> bool:
    """Whether a notification sent from another connection reaches ``conn`` while it waits
    between transactions, as a beat's listener waits. Through a transaction-pooling PgBouncer
    none does: LISTEN holds for the server session that ran it, which the pooler lends to
    other clients or keeps idle, dropping what arrives. The channel is this test's own, so no
    beat wakes for it, and it is let go of either way (where the pooler allows)."""
    channel = f"schedapp_probe_{uuid.uuid4().hex}"
    conn.execute(f"LISTEN {channel}")
    try:
        with psycopg.connect(**params) as sender:
            sender.execute(query("notify_at"), [channel, ""])
        with closing(conn.notifies(timeout=PROBE_SECONDS, stop_after=1)) as notes:
            return any(note.channel == channel for note in notes)
    finally:
        conn.execute(f"UNLISTEN {channel}")


def _due(payload: str) -> float:
    try:
        return float(payload)
    except ValueError:
        return 0.0  # unknown payload: wake
