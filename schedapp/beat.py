"""The beat loop: ``celery -A project beat -S schedapp.beat:LeaseScheduler``.

Run as many copies as you like, on as many hosts: they share the due jobs through the database
(``lease.claim_due_jobs``), never load all jobs, and sleep until the next due instant found in
the index, waking early when PostgreSQL notifies them of new work.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from celery import Celery, signals
from celery.beat import DEFAULT_MAX_INTERVAL, Scheduler

from . import conf, metrics, partitions
from .db import (
    CONNECTION_ERRORS,
    bound_connection_waits,
    bounded_wait,
    forget_inherited_connections,
    reset_connection,
    with_retries,
)
from .deadlines import check_deadlines
from .declared import sync_declared_calendars, sync_declared_jobs
from .dispatch import Dispatcher, PublishResult
from .lease import (
    ClaimedRun,
    ClaimResult,
    Superseded,
    backfill,
    claim_due_jobs,
    give_back,
    quarantine_job,
    seconds_until_due,
)
from .lease.quarantine import first_line, no_partition
from .models import Node
from .nodes import record_node
from .notify.delivery import DeliveryLoop
from .notify.outbox import configured_channels
from .settings_checks import refuse_bad_settings
from .store import Listener, get_store

log = logging.getLogger("schedapp.beat")
_NO_WAKE = float("-inf")  # a sleep not taken on the listener (see _until_next_claim)
# The id the next beat of a process takes, by pid (a forked process takes its own).
_unclaimed_ids: dict[int, str] = {}
_ids_lock = threading.Lock()


def _next_beat_id(claim: bool = False) -> str:
    """The id the next scheduler of this process works under; ``claim`` takes it.

    ``celery beat`` prints its banner from a scheduler it builds for the banner alone
    (``service.get_scheduler(lazy=True)``), then builds the one that runs: the banner's shows
    this id, the running one claims it at its first tick, so the banner names the id the beat
    claims jobs and records itself under. A second scheduler in the process gets a new one."""
    pid = os.getpid()
    with _ids_lock:
        beat_id = _unclaimed_ids.get(pid) or f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:6]}"
        if claim:
            _unclaimed_ids.pop(pid, None)
        else:
            _unclaimed_ids[pid] = beat_id
        return beat_id


# Celery beat's own logger: its dispatch lines go wherever a team's Celery beat logs went.
celery_log = logging.getLogger("celery.beat")


class LeaseScheduler(Scheduler):
    """A Celery beat scheduler whose schedule lives in the database, shared by many beats.

    ``tick()`` does one unit of work (reap, claim a batch, publish it) and returns the seconds
    to sleep; where it can listen for notifications it does the sleeping itself, on the
    notification socket, so that a newly due job wakes it early, and returns 0.
    """

    def __init__(self, app: Celery, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        # First thing in a beat forked from a worker (`celery worker -B`), before anything
        # else could reuse the descriptor of a connection the worker held as it forked.
        forget_inherited_connections()
        self._beat_id: str | None = None  # claimed at setup (see _next_beat_id)
        self._dispatcher: Any = None
        self._listener: Listener | None = None
        self._listener_tried = 0.0
        self._failures = 0
        self._superseded_at = float("-inf")  # when the last claim looked for runs to supersede
        self._deadlines_at = float("-inf")  # when the last deadline pass ran
        self._partitions_at = float("-inf")  # when the last partition pass ran
        self._backfills_at = float("-inf")  # when the last look for running backfills was
        self._backfill_wait: float | None = None  # None: none was running at the last look
        self._broker_down = False  # a publish failed: probe the broker before claiming again
        # Notifications of jobs due by then wake the beat early (epoch seconds, database
        # clock); None: any notification does; _NO_WAKE: none does.
        self._wake_at_db: float | None = None
        self._claimed_at = float("-inf")  # when this beat's last claim began (monotonic)
        self._last_node_update = 0.0
        self._started_at = datetime.now(UTC)
        # Embedded in a worker (`celery worker -B`): the worker serves the metrics, and with
        # PROMETHEUS_MULTIPROC_DIR the beat's among them (see `_embedded`).
        self.embedded = False
        self._busy = False  # a tick is under way (it may be inside a statement)
        self._interrupted = False  # one was cut short (SIGTERM, Ctrl-C) mid-way
        self._closed = False
        self._notifier: DeliveryLoop | None = None  # notifications, on a thread of their own
        self.stats = {
            "claimed": 0,
            "dispatched": 0,
            "publish_failures": 0,
            "released": 0,
            "reaped": 0,
            "misfires_skipped": 0,
            "ticks": 0,
        }
        # Lazy or not, building the scheduler touches no database (lazy: `celery beat` prints
        # its banner with one): the setup is the first tick's work. `celery beat`'s SIGTERM
        # handler asks for the scheduler to close it, and would build a second one, from
        # inside the first's setup, if the first were still being built.
        # Settings it cannot work with stop it here, not in a tick, which would back off and
        # try again for ever (Celery runs no Django system checks before a beat).
        refuse_bad_settings("beat")
        bound_connection_waits()  # no connection opened: options for those to come
        super().__init__(app, *args, lazy=True, **kwargs)
        # --max-interval / beat_max_loop_interval as given (Celery's default: 300 s) bounds
        # the sleeps and back-offs; the attribute Celery's banner prints is the longest sleep
        # this beat really takes, which SCHEDAPP_MAX_SLEEP (5 s) cuts further.
        given: Any = getattr(self, "max_interval", None)  # Celery's, untyped
        self._given_max_interval = float(given or DEFAULT_MAX_INTERVAL)
        self.max_interval = min(conf.get_settings().MAX_SLEEP, self._given_max_interval)

    # --- celery.beat.Scheduler interface --------------------------------------------------

    @property
    def beat_id(self) -> str:
        """host:pid:random; until the first tick, the id this scheduler will claim then."""
        return self._beat_id or _next_beat_id()

    def setup_schedule(self) -> None:
        """Done by the first tick (a failed setup is backed off from and done again)."""
        if self._beat_id is None:
            self._beat_id = _next_beat_id(claim=True)
        self.settings = conf.get_settings()
        self.max_interval = min(self.settings.MAX_SLEEP, self._given_max_interval)
        self._ensure_listener()
        if not self.embedded:  # its worker's port: taken first, the worker would serve none
            metrics.start_metrics_server()
        self._sync_declared_jobs()
        self._ensure_partitions()  # before the first claim inserts a run or a record
        self._dispatcher = Dispatcher(self.app, origin=f"schedapp-beat@{self.beat_id}")
        if self.settings.NOTIFY_IN_BEAT and self._notifier is None and configured_channels():
            # Never in the tick: a slow webhook must not delay a claim.
            self._notifier = DeliveryLoop()
            self._notifier.start()
        log.info(
            "beat %s started: schedapp.beat:LeaseScheduler, sharing the due jobs with every "
            "beat on %s (batch %d, %s)",
            self.beat_id,
            get_store().label(),
            self.settings.BATCH_SIZE,
            "woken by LISTEN/NOTIFY" if self._listener is not None else "polling",
            extra={"action": "beat_start", "beat": self.beat_id},
        )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One unit of work; never raises (Celery's beat loop exits on any exception from
        ``tick``): an unreachable database or broker, or an error nobody foresaw, is logged
        and backed off from, and the beat goes on. Only a stop goes through (SystemExit from
        ``celery beat``'s SIGTERM/SIGINT handler, KeyboardInterrupt), wherever it finds the
        tick."""
        self._busy = True
        try:
            return self._tick()
        except BaseException:
            self._interrupted = True  # its connection may be left inside a statement
            raise
        finally:
            self._busy = False

    def _tick(self) -> float:
        self.stats["ticks"] += 1
        started = time.monotonic()
        try:
            if self._dispatcher is None:  # the first tick: set up now
                self.setup_schedule()
            self._ensure_listener()
            # A statement of the tick still waiting for its reply after SCHEDAPP_DB_TIMEOUT
            # (a network black hole) has its connection given up: the tick fails as on a
            # lost connection and backs off, instead of stopping this beat for hours.
            with bounded_wait(None, "beat tick"):
                delay = self._work()
            self._failures = 0
            metrics.beat_tick(time.monotonic() - started, time.time())
        except CONNECTION_ERRORS as exc:
            reset_connection()
            delay = self._backoff()
            metrics.beat_error("database")
            log.error(
                "database unavailable: %s; retrying in %.1fs",
                exc,
                delay,
                extra={"action": "db_unavailable", "beat": self.beat_id},
            )
        except Exception as exc:
            reset_connection()
            delay = self._backoff()
            metrics.beat_error("unexpected")
            if no_partition(exc):
                # A run's or a ledger record's id above every partition (they are made ahead:
                # this should not happen): make them at the next tick, which claims the same
                # jobs again.
                self._partitions_at = float("-inf")
            log.exception(
                "beat tick failed: %s; retrying in %.1fs",
                exc,
                delay,
                extra={"action": "tick_failed", "beat": self.beat_id},
            )
        return self._sleep(delay)

    def should_sync(self) -> bool:
        return False  # the database is the schedule; there is nothing to sync to disk

    def sync(self) -> None:
        pass

    def close(self) -> None:
        """Close the LISTEN connection and remove this beat's node row, once.

        ``celery beat``'s SIGTERM/SIGINT handler calls this from inside whatever the beat was
        doing, then raises SystemExit, and Celery calls it again as the beat exits. A tick
        under way may be inside a statement on this process's connection, which cannot be
        used before that statement ends (it would wait for ever on the statement it
        interrupted): then this waits for the second call, which finds the tick ended and
        opens a fresh connection."""
        if self._busy or self._closed:
            return
        self._closed = True
        if self._notifier is not None:
            self._notifier.stop()
        if self._interrupted:
            reset_connection()
        if self._listener is not None:
            self._listener.close()
        try:
            Node.objects.filter(name=self.beat_id).delete()
        except Exception:  # shutting down; the row ages out of the overview
            pass
        log.info("beat %s stopped", self.beat_id, extra={"action": "beat_stop"})

    @property
    def info(self) -> str:
        return f"    . schedapp beat {self.beat_id}: jobs in the database"

    # The base class's heap of in-memory entries is not used.
    @property
    def schedule(self) -> dict:  # type: ignore[override]
        return {}

    # --- one unit of work -----------------------------------------------------------------

    def _work(self) -> float:
        if self._broker_down:
            # Claiming now would only record and release a batch again: ask the broker first.
            if not self._dispatcher.probe():
                metrics.beat_error("broker")
                return self._backoff()
            self._broker_down = False
            log.info("broker reachable again", extra={"action": "broker_back"})
        self._ensure_partitions()  # before the claim that inserts runs and records
        batch = self.settings.BATCH_SIZE
        # Runs to supersede (cancel_other, terminate_other) are looked for at most once a
        # second: a burst's back-to-back claims do not each pay the statement.
        supersede = time.monotonic() - self._superseded_at >= 1.0
        # With none running at the last look, the next look (at most every quarter second)
        # is one statement in the claim's transaction, not a transaction of its own.
        look = self._backfill_wait is None and time.monotonic() - self._backfills_at >= 0.25
        self._claimed_at = time.monotonic()
        claimed: list[ClaimedRun] = []  # filled just before the claim's COMMIT
        published = PublishResult()  # filled as each run reaches the broker
        try:
            result = claim_due_jobs(
                self.beat_id,
                batch,
                message_expiry=self._dispatcher.message_expiry,
                supersede=supersede,
                look_for_backfills=look,
                next_due=True,
                claimed=claimed,
            )
            if supersede:
                self._superseded_at = time.monotonic()
            if look:
                self._backfills_at = time.monotonic()
            claimed_at = time.monotonic()
            reap = result.reap
            metrics.claimed(result.claimed, misfires_skipped=result.skipped_misfires)
            metrics.reaped(
                reap.expired, started=reap.started, dead=reap.dead, carried_on=reap.carried_on
            )
            metrics.quarantined(len(result.quarantined) + len(reap.quarantined), "beat")
            self.stats["claimed"] += result.claimed
            self.stats["reaped"] += reap.expired
            self.stats["misfires_skipped"] += result.skipped_misfires
            if result.runs:
                self._dispatcher.publish(result.runs, published)
        except BaseException as exc:
            self._give_back(claimed, published, exc)
            raise
        if result.runs:
            for run, reason in published.refused:
                if quarantine_job(run.job_id, reason, token=run.token):
                    metrics.quarantined(1, "beat")
            self._log_dispatches(published.published)
            self.stats["dispatched"] += len(published.published)
            # lag = publish time - due time, both in the database clock: the claim's now()
            # plus the time spent since (measured on a monotonic clock, not a wall clock)
            elapsed = time.monotonic() - claimed_at
            metrics.dispatched(
                len(published.published), [r.lateness + elapsed for r in published.published]
            )
            if published.failed:
                metrics.publish_failed(len(published.failed))
                metrics.beat_error("broker")
                self.stats["publish_failures"] += 1
                self.stats["released"] += give_back(published.failed, str(published.error))
                self._broker_down = True
                self._maybe_update_node()
                return self._backoff()
        self._revoke_superseded(result.superseded)
        self._advance_backfills(batch, result.backfilling)
        self._check_deadlines()
        self._maybe_update_node()
        if result.claimed >= batch or reap.expired:
            return 0.0  # more is due right now
        return self._until_next_claim(result)

    def _give_back(
        self, claimed: list[ClaimedRun], published: PublishResult, exc: BaseException
    ) -> None:
        """Give back at once what a claim took and the tick did not send, when the tick is
        cut short once the claim's COMMIT went out: the beat stopped (Celery's SIGTERM/SIGINT
        handler raises SystemExit wherever the beat is: in the COMMIT, between the claim and
        the publish, part-way through a batch) or the COMMIT's reply lost. Otherwise those
        runs wait, dispatched and never sent, for their lease to lapse, and for ever when no
        beat is left to reap them. What was sent stays dispatched (given back, it would be
        sent again); ``give_back`` is fenced (a job's claim by its token, an allow_all run by
        its own row), so a claim that did not commit gives nothing back."""
        sent = {r.run_id for r in published.published}
        unsent = [r for r in claimed if r.run_id not in sent]
        if not unsent:
            return
        reason = "beat stopped"
        if isinstance(exc, Exception):
            reason = f"the tick failed after its claim: {first_line(exc)}"
        # The connection may be inside the statement the stop interrupted (its COMMIT).
        reset_connection()
        try:
            self.stats["released"] += give_back(unsent, reason)
        except Exception as err:  # the database is gone too: their leases bring them back
            log.warning(
                "could not give back %d claimed run(s): %s",
                len(unsent),
                err,
                extra={"action": "give_back_failed", "beat": self.beat_id},
            )

    def _until_next_claim(self, result: ClaimResult) -> float:
        """The sleep after a claim that did not fill its batch: until the next due instant
        the claim read, and at a steady stream no less than what keeps this beat's claims
        ``MIN_SLEEP`` apart. Jobs coming due every millisecond would otherwise each cost a
        claim of their own, a transaction and a commit, however many beats share them; with
        the floor a beat takes what came due in its last ``MIN_SLEEP`` in one. A job due
        after a quiet spell is claimed at its instant: the floor counts from the last claim.
        A floor's sleep is Celery's loop's, not the listener's: it ends within ``MIN_SLEEP`` and
        the claim after it sees every job committed meanwhile, so a notification has nothing
        to cut short, and a wait on the notification socket costs about a millisecond of CPU
        (psycopg's ``notifies``) against a twentieth of one for a plain sleep, a hundred
        times a second at a stream. What was notified meanwhile is read at the next wait on
        the listener (and can end it once, early)."""
        until = result.wake.until_due() if result.wake is not None else seconds_until_due()
        if until is None:
            self._wake_at_db = None
            if self._backfill_wait is not None:
                return min(self._sleep_ceiling, self._backfill_wait)
            return self._sleep_ceiling
        db_now, delay = until
        floor = self._claimed_at + self.settings.MIN_SLEEP - time.monotonic()
        if delay <= 0 and not result.claimed:
            # Due, but we claimed none of it: other beats hold those rows. Let them commit.
            floor = self.settings.MIN_SLEEP
        if delay < floor:
            self._wake_at_db = _NO_WAKE
            return floor if self._backfill_wait is None else min(floor, self._backfill_wait)
        delay = min(delay, self._sleep_ceiling)
        if self._backfill_wait is not None:
            delay = min(delay, self._backfill_wait)
        self._wake_at_db = db_now.timestamp() + delay
        return delay

    def _advance_backfills(self, batch: int, backfilling: bool | None) -> None:
        """Move the running backfills on (``lease.backfill``) and publish their runs through
        the same dispatcher as the claim's. With none running, the claim looks for one at
        most every quarter second (``backfilling``: what it found, None when it did not
        look), so a burst's back-to-back ticks pay neither the statement nor a transaction;
        while one runs, every tick advances. A run the broker did not take, or that a stop
        kept from being sent, is given back at once (``give_back``) as the claim's are; one
        refused (its task not allowed, no route) stays dispatched under its own lease, which
        the reaper ends."""
        if self._backfill_wait is None and not backfilling:
            return
        self._backfills_at = time.monotonic()
        runs, self._backfill_wait = backfill.advance(self.beat_id, batch, self._backfills_at)
        if not runs:
            return
        published = PublishResult()
        try:
            self._dispatcher.publish(runs, published)
        except BaseException as exc:
            self._give_back(runs, published, exc)
            raise
        for run, reason in published.refused:
            log.warning(
                "backfilled run of job %s not published: %s",
                run.job_id,
                reason,
                extra={"action": "backfill_refused", "job": run.job_id},
            )
        self._log_dispatches(published.published)
        self.stats["dispatched"] += len(published.published)
        metrics.dispatched(len(published.published), [0.0 for _ in published.published])
        if published.failed:
            metrics.publish_failed(len(published.failed))
            self.stats["released"] += give_back(published.failed, str(published.error))

    def _revoke_superseded(self, runs: list[Superseded]) -> None:
        """Cancel the runs a later occurrence supersedes (overlap policies cancel_other and
        terminate_other): the claim marked them in its transaction, their tasks are revoked
        now. A revoke the broker does not take is logged: the run then goes on to its end,
        and its outcome moves the job on to the latest occurrence as a revoke would have."""
        for superseded in runs:
            if not superseded.task_ids:
                continue
            try:
                self.app.control.revoke(
                    list(superseded.task_ids), terminate=superseded.terminate, signal="SIGTERM"
                )
            except Exception as exc:
                log.warning(
                    "job %s: could not revoke %s, superseded by a later occurrence: %s",
                    superseded.job_id,
                    list(superseded.task_ids),
                    exc,
                    extra={"action": "supersede_failed", "job": superseded.job_id},
                )
                continue
            log.info(
                "job %s: %s %s, superseded by a later occurrence",
                superseded.job_id,
                "terminated" if superseded.terminate else "revoked",
                list(superseded.task_ids),
                extra={"action": "supersede", "job": superseded.job_id},
            )

    def _check_deadlines(self) -> None:
        """The deadline pass (``schedapp.deadlines``), every ``SCHEDAPP_DEADLINE_CHECK``
        seconds, after the claim's work: breaches recorded and cleared, their signals sent
        after commit, overrunning runs revoked when their job asks. Its failure is logged and
        never holds up the claims: the next pass tries again."""
        if time.monotonic() - self._deadlines_at < self.settings.DEADLINE_CHECK:
            return
        self._deadlines_at = time.monotonic()
        try:
            found = check_deadlines()
        except CONNECTION_ERRORS:
            raise  # the tick's own handling: reset the connection, back off
        except Exception as exc:
            log.exception("deadline pass failed: %s", exc, extra={"action": "deadline_pass_failed"})
            return
        for task_id in found.to_revoke:
            try:
                self.app.control.revoke(task_id, terminate=True, signal="SIGTERM")
            except Exception as exc:
                log.warning(
                    "could not revoke overrunning %s: %s",
                    task_id,
                    exc,
                    extra={"action": "overrun_revoke_failed"},
                )
            else:
                log.info(
                    "revoked %s: running past its max_runtime",
                    task_id,
                    extra={"action": "overrun_revoked"},
                )

    def _ensure_partitions(self) -> None:
        """Partitions of the run history and of the occurrence ledger made ahead of their ids
        (``schedapp.partitions``), at the start and every ``CHECK_EVERY`` seconds after; on
        PostgreSQL only. A failure is logged and never holds up the claims (partitions are
        made a day's worth ahead), nor the other table's pass."""
        if time.monotonic() - self._partitions_at < partitions.CHECK_EVERY:
            return
        self._partitions_at = time.monotonic()
        for table in partitions.TABLES:
            try:
                partitions.ensure_partitions(self.settings.HISTORY_PARTITION, table=table)
            except CONNECTION_ERRORS:
                raise  # the tick's own handling: reset the connection, back off
            except Exception as exc:
                log.exception(
                    "partition pass failed (%s): %s",
                    table.what,
                    exc,
                    extra={"action": "partition_pass_failed", "table": table.parent},
                )

    @property
    def _sleep_ceiling(self) -> float:
        """The longest sleep without looking: nothing wakes a beat early without LISTEN, so
        it then looks at least every second (MAX_SLEEP stays the ceiling if shorter), and
        none is longer than the beat's max interval (``celery beat --max-interval``,
        ``beat_max_loop_interval``), as Celery's beat promises."""
        ceiling = self.settings.MAX_SLEEP
        if self._listener is None:
            ceiling = min(ceiling, 1.0)
        return min(ceiling, self._max_interval)

    @property
    def _max_interval(self) -> float:
        return self._given_max_interval

    def _log_dispatches(self, runs: list[Any]) -> None:
        """Celery beat logs ``Scheduler: Sending due task <entry> (<task>)`` for every send,
        and teams alert on it: the same line per dispatch (``SCHEDAPP_DISPATCH_LOG="each"``,
        at most ``DISPATCH_LOG_BURST`` lines a batch, then a summary), a summary per batch
        (``"batch"``), or nothing (``"off"``)."""
        mode = self.settings.DISPATCH_LOG
        if mode == "off" or not runs:
            return
        shown = runs[: self.settings.DISPATCH_LOG_BURST] if mode == "each" else []
        for run in shown:
            if run.attempt > 1:  # a retry: the line says which, or it reads as a scheduled send
                celery_log.info(
                    "Scheduler: Sending due task %s (%s), retry %d/%d",
                    run.name,
                    run.task,
                    run.attempt - 1,
                    run.max_retries,
                )
            else:
                celery_log.info("Scheduler: Sending due task %s (%s)", run.name, run.task)
        if len(runs) > len(shown):
            celery_log.info(
                "Scheduler: Sent %d due tasks in one batch (%d not listed one by one)",
                len(runs),
                len(runs) - len(shown),
            )

    def _backoff(self) -> float:
        self._failures += 1
        self._wake_at_db = None
        return min(0.5 * 2 ** (self._failures - 1), 30.0, self._max_interval)

    def _sleep(self, delay: float) -> float:
        if delay <= 0 or self._listener is None or self._wake_at_db == _NO_WAKE:
            return delay  # Celery's loop sleeps it
        woken = self._listener.wait(delay, self._wake_at_db)
        if woken is None:  # the listener broke: poll until it can be opened again
            self._listener = None
            return min(delay, 1.0)
        return 0.0

    def _ensure_listener(self) -> None:
        """(Re)open the notification connection, at most every few seconds (it fails while
        PostgreSQL is down; meanwhile the beat polls every second)."""
        if self._listener is not None or time.monotonic() - self._listener_tried < 5.0:
            return
        self._listener_tried = time.monotonic()
        self._listener = get_store().listen()

    def _maybe_update_node(self) -> None:
        now = time.monotonic()
        if now - self._last_node_update < self.settings.NODE_HEARTBEAT:
            return
        self._last_node_update = now
        metrics.heartbeat("beat")
        record_node(self.beat_id, "beat", self._started_at, dict(self.stats))

    def _sync_declared_jobs(self) -> None:
        """Calendars (SCHEDAPP_CALENDARS), then jobs (SCHEDAPP_JOBS, @periodic) declared in
        code are created or updated; a bad declaration is reported and never stops the beat."""
        try:
            with_retries(sync_declared_calendars, what="declared calendars sync", attempts=3)
        except Exception as exc:
            log.exception(
                "could not sync declared calendars: %s",
                exc,
                extra={"action": "declared_calendars_sync_failed"},
            )
        try:
            # the sync logs its report (and names each conflict) itself
            with_retries(sync_declared_jobs, what="declared jobs sync", attempts=3)
        except Exception as exc:
            log.exception(
                "could not sync declared jobs: %s", exc, extra={"action": "declared_sync_failed"}
            )


def _embedded(sender: Any = None, **_: Any) -> None:
    """Celery sends ``beat_embedded_init`` in the beat process of ``celery worker -B``, with
    its Service, before the first tick (where the scheduler sets itself up)."""
    scheduler = getattr(sender, "scheduler", None)
    if isinstance(scheduler, LeaseScheduler):
        scheduler.embedded = True


signals.beat_embedded_init.connect(_embedded, weak=False, dispatch_uid="schedapp.beat.embedded")
