#!/usr/bin/env python
"""Chaos runs: real beats and workers under injected faults, then a strict check of the history.

    python -m bench.chaos --duration 90 --seed 7             # the short run CI does
    python -m bench.chaos --seeds 10 --minutes 10            # the long mode (bench/README.md)
    python -m bench.chaos --seeds 3 --minutes 2              # a few short seeds
    python -m bench.chaos --profile prefetch --defect unrenewed-reserved   # must FAIL
    python -m bench.chaos --scenario redis-outage            # Redis down, then back
    python -m bench.chaos --scenario postgres-outage         # PostgreSQL restarted mid-flight

Each run starts a private PostgreSQL cluster, a private Redis and a fault-injecting proxy
(schedapp.testing.pgproxy) through which every beat and worker reaches PostgreSQL (each names its
connections after itself, so a fault can target one), 3 beats and 2 prefork workers (one with
Celery's default prefetch, multiplier 4), schedules a mix of jobs (one-offs spread over the
window, long jobs that live on lease renewals, interval and cron jobs, flaky jobs that retry,
jobs that always fail, a job per overlap policy whose runs outlast their interval, a job
paused and resumed), and injects faults on a seeded plan: a worker SIGKILLed, frozen
(SIGSTOP) for less or more than the lease, cut off from PostgreSQL for less or more than the
lease; a beat killed, frozen, or stopped in the middle of its claim (the proxy holds its
COMMIT, locks held); Redis down for longer than the lease while long jobs run; a reply lost
after its statement committed (door, completion, renewal, a beat's COMMIT); latency spikes.
A supervisor restarts what died. Every execution is recorded by the task itself.

The oracle (bench/chaos_oracle.py) then demands: every duplicate execution blamed on a fault
that could cause it (a kill, or a freeze or partition at least a lease long, of the worker that
held the lease that was lost, in the window before the job was claimed again), no occurrence
lost; every occurrence expected in the window with exactly one fate in the occurrence
ledger (a run row, or a record of why it did not run), none recorded as not run that executed,
every one recorded as run executed (unless cancel_other superseded it before it started); no
allow_all job over its max_concurrent beyond runs a fault lost;
and no job stuck with an expired lease, every dead job out of retries, no stale
completion applied. Exit status 0 means every check passed. ``--out`` writes the figures of a
run as JSON; several seeds run one process each and their table goes to
bench/results/chaos.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import chaos_oracle as oracle  # noqa: E402
from schedapp.testing import processes  # noqa: E402
from schedapp.testing.fleet import Fleet  # noqa: E402
from schedapp.testing.pgproxy import COMMIT, ProxyControl, spawn_proxy  # noqa: E402
from schedapp.testing.processes import Proc  # noqa: E402
from schedapp.testing.servers import PrivatePostgres, PrivateRedis  # noqa: E402

# Beats and workers run the bench's Celery app, which installs CHAOS_DEFECT's defect
# (bench/worker_app.py); without it, the demo project's app as it is.
APP = "bench.worker_app"

LEASE = 8  # seconds, every job: short, so that recovery happens well inside the run
# Renewals start a third of a lease in, every second: a pause up to LEASE * 2/3 - 1 s can never
# lose a lease, one of a whole lease or more can. Short faults stay under SHORT, long ones
# over LONG; the oracle only ever accepts the long ones (and kills) as a cause.
SHORT = (0.3, 2.0)
LONG = (1.5 * LEASE, 2.0 * LEASE)
# From a lease's expiry to the job's next claim: a beat's longest sleep (5 s) and the retry
# backoff (capped at 2 s below), plus a beat restarting after a kill.
SLACK = 12.0
# A recurring job whose pending occurrence is older than this when beats stop is stuck (a job
# whose runs outlast its interval falls behind, by its misfire grace or buffer at most).
BEHIND = 180
RESULTS = ROOT / "bench" / "results"


@dataclass
class WorkerSlot:
    """A worker the supervisor keeps alive: its settings survive a restart."""

    proc: Proc
    concurrency: int
    prefetch: int


class Harness:
    """Servers, the proxy, processes, and a supervisor that restarts whatever died."""

    def __init__(
        self,
        workdir: Path,
        beats: int = 3,
        workers: int = 2,
        concurrency: int = 3,
        prefetch: tuple[int, ...] = (1,),
        proxy: bool = False,
    ) -> None:
        self.workdir = workdir
        self.pg = PrivatePostgres()
        self.redis = PrivateRedis()
        self.n_beats, self.n_workers = beats, workers
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.use_proxy = proxy
        self.proxy: ProxyControl | None = None
        self.beats: list[Proc] = []
        self.slots: list[WorkerSlot] = []
        self.fleet: Fleet | None = None
        self.faults: list[oracle.Fault] = []
        self.armed: list[str] = []  # proxy faults armed (they fire at the next match)
        self._stack = ExitStack()

    @property
    def workers(self) -> list[Proc]:
        return [s.proc for s in self.slots]

    def start_servers(self) -> None:
        self.pg.init()
        self.redis.start()
        os.environ.update(
            {
                "DATABASE_URL": self.pg.url,
                "CELERY_BROKER_URL": self.redis.url,
                "DJANGO_SETTINGS_MODULE": "project.settings_test",
                "SCHEDAPP_VAR_DIR": str(self.workdir / "var"),
                "SCHEDAPP_BEAT_TRANSACTION_TIMEOUT": "5",
                "SCHEDAPP_BATCH_SIZE": "100",
            }
        )
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        if os.environ.get("CHAOS_DEFECT"):
            from bench.defects import install_in_database

            install_in_database(os.environ["CHAOS_DEFECT"])
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if self.use_proxy:
            self.proxy = self._stack.enter_context(
                spawn_proxy(self.workdir / "pgproxy.sock", upstream=("127.0.0.1", self.pg.port))
            )
            env["DATABASE_URL"] = self.proxy.database_url(self.pg.url)
        self.fleet = Fleet(self.workdir, env, app=APP, cwd=ROOT)

    def _worker(self, concurrency: int, prefetch: int, wait: bool = True) -> Proc:
        assert self.fleet is not None
        proc = self.fleet.worker(
            concurrency=concurrency,
            heartbeat=1,
            wait=wait,
            extra_args=["--prefetch-multiplier", str(prefetch)],
        )
        if prefetch > 1:  # a configuration, not an event: it may never explain a duplicate
            now = time.time()
            self.faults.append(oracle.Fault("prefetch", proc.name, now, now, f"x{prefetch}"))
        return proc

    def start_processes(self) -> None:
        assert self.fleet is not None
        self.beats = [self.fleet.beat(wait=False) for _ in range(self.n_beats)]
        self.slots = [
            WorkerSlot(self._worker(self.concurrency, p, wait=False), self.concurrency, p)
            for p in (self.prefetch * self.n_workers)[: self.n_workers]
        ]
        for beat in self.beats:
            beat.wait_for("schedapp.beat: beat ", timeout=90)
        for slot in self.slots:
            slot.proc.wait_for(" ready.", timeout=120)

    def supervise(self) -> list[str]:
        """Restart dead processes, as systemd or Kubernetes would."""
        assert self.fleet is not None
        restarted = []
        for i, proc in enumerate(self.beats):
            if not proc.alive():
                self.beats[i] = self.fleet.beat(wait=False)
                restarted.append(proc.name)
        for slot in self.slots:
            if not slot.proc.alive():
                restarted.append(slot.proc.name)
                slot.proc = self._worker(slot.concurrency, slot.prefetch, wait=False)
        return restarted

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop_all()
        self._stack.close()
        self.redis.stop(kill=True)
        self.pg.destroy()


# --- the job mix and the fault plan -------------------------------------------------------

RETRY = {"lease_seconds": LEASE, "retry_backoff": 1, "retry_backoff_max": 2}


def schedule_mix(window: float, scale: float, rng: random.Random) -> dict[str, int]:
    from schedapp import api
    from schedapp.db import db_now

    now = db_now()
    counts: Counter = Counter()
    # One-off kinds, spread over the window: (name, how many, task, kwargs, options).
    one_offs = [
        ("once", int(1500 * scale), "project.tasks.record", {}, RETRY),
        (
            "long",  # lives on lease renewals: two and a half leases long
            max(2, int(8 * scale)),
            "project.tasks.record",
            {"sleep": 2.5 * LEASE},
            {**RETRY, "max_retries": 10},
        ),
        (
            "flaky",
            max(4, int(30 * scale)),
            "project.tasks.flaky",
            {"failures": 2},
            {**RETRY, "max_retries": 6},
        ),
        ("fail", max(2, int(6 * scale)), "project.tasks.fail", {}, {**RETRY, "max_retries": 2}),
    ]
    specs = []
    for kind, count, task, kwargs, options in one_offs:
        for i in range(count):
            at = now + timedelta(seconds=5 + rng.random() * window)
            specs.append(
                {
                    "task": task,
                    "run_at": at,
                    "name": f"{kind}-{i}",
                    "kwargs": {"label": f"{kind}-{i}", **kwargs},
                    **options,
                }
            )
    for i in range(6):
        specs.append(
            {
                "task": "project.tasks.record",
                "interval": 3,
                "name": f"every3-{i}",
                "kwargs": {"label": f"every3-{i}"},
                **RETRY,
            }
        )
    for i, zone in enumerate(("UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata")):
        specs.append(
            {
                "task": "project.tasks.record",
                "cron": "*/5 * * * * *",
                "timezone": zone,
                "name": f"cron5-{i}",
                "kwargs": {"label": f"cron5-{i}"},
                **RETRY,
            }
        )
    specs += overlap_specs(rng)
    api.schedule_many(specs)
    for spec in specs:
        counts[spec["name"].split("-")[0]] += 1
    return dict(counts)


# Jobs whose runs outlast their interval, one per overlap policy (and allow_all twice): the
# ledger's decisions (overlapped, misfired, buffer_full, a slot waited for, a run superseded)
# made while workers and beats are hit. Interval, run length and the policy's bound are
# drawn from the seed; every run outlasts its interval.
OVERLAPS = (
    ("skip", {"overlap": "skip"}),
    ("bufone", {"overlap": "buffer_one", "misfire_grace": 6}),
    # Falls behind as bufone, and what it finds missed longer ago than 5 s is outside_window.
    ("window", {"overlap": "buffer_one", "misfire_grace": 3, "catchup_window": 5}),
    ("bufall", {"overlap": "buffer_all", "max_buffer": 2}),
    ("cancel", {"overlap": "cancel_other"}),
    ("allow2", {"overlap": "allow_all", "max_concurrent": 2}),
    ("allow3", {"overlap": "allow_all", "max_concurrent": 3}),
)
# The job the run pauses and resumes (chaos_ledger_actions): its occurrences in between are
# recorded ``paused``.
PAUSED = "paused-0"


def overlap_specs(rng: random.Random) -> list[dict[str, Any]]:
    """The overlap jobs and the job to pause, drawn from ``rng``."""
    specs = []
    for name, options in OVERLAPS:
        interval = rng.choice((2, 3))
        sleep = interval + rng.uniform(0.5, 2.5)
        specs.append(
            {
                "task": "project.tasks.record",
                "interval": interval,
                "name": f"{name}-0",
                "kwargs": {"label": f"{name}-0", "sleep": round(sleep, 1)},
                **RETRY,
                "max_retries": 10,
                **options,
            }
        )
    specs.append(
        {
            "task": "project.tasks.record",
            "interval": 2,
            "name": PAUSED,
            "kwargs": {"label": PAUSED},
            **RETRY,
            # Found late on its resume (run_once): the latest runs, the others are `paused`.
            "misfire_grace": 2,
        }
    )
    return specs


def ledger_actions(duration: float, rng: random.Random) -> list[tuple[float, float, str]]:
    """When (seconds into the run) the paused job is paused, and how long after the pause
    it is resumed: once, a third to a half into the window, for 10 to 25 s."""
    return [(duration * rng.uniform(0.3, 0.5), 0.0, "pause"), (0.0, rng.uniform(10, 25), "resume")]


def act(action: str) -> None:
    """Pause or resume the paused job, as a person would in the admin."""
    from schedapp import api
    from schedapp.db import reset_connection
    from schedapp.models import Job

    reset_connection()
    job = Job.objects.get(name=PAUSED)
    (api.pause if action == "pause" else api.resume)(job, reason="chaos")


def schedule_prefetch_mix(rng: random.Random) -> dict[str, int]:
    """A handful of long one-offs due together: more than one process can run at once, so
    most wait in the prefetch buffer for longer than their lease."""
    from schedapp import api
    from schedapp.db import db_now

    now = db_now()
    api.schedule_many(
        {
            "task": "project.tasks.record",
            "run_at": now + timedelta(seconds=2 + rng.random()),
            "name": f"long-{i}",
            "kwargs": {"label": f"long-{i}", "sleep": LEASE / 2},
            **RETRY,
            "max_retries": 10,
        }
        for i in range(4)
    )
    return {"long": 4}


def schedule_ledger_mix(rng: random.Random) -> dict[str, int]:
    """The overlap jobs and the job to pause, alone: the ledger's decisions without faults."""
    from schedapp import api

    specs = overlap_specs(rng)
    api.schedule_many(specs)
    return dict(Counter(spec["name"].split("-")[0] for spec in specs))


def schedule_long_mix() -> dict[str, int]:
    """Two jobs two and a half leases long, running when the broker goes away."""
    from schedapp import api
    from schedapp.db import db_now

    now = db_now()
    api.schedule_many(
        {
            "task": "project.tasks.record",
            "run_at": now,
            "name": f"long-{i}",
            "kwargs": {"label": f"long-{i}", "sleep": 2.5 * LEASE},
            **RETRY,
            "max_retries": 10,
        }
        for i in range(2)
    )
    return {"long": 2}


# Lost replies: a fragment of the statement whose reply is dropped after it committed, and
# the processes it may hit. The worker's writes are single autocommit statements.
LOST_REPLIES = (
    ("door", b"SELECT schedapp_admit_run_v6(", "worker*"),
    ("completion", b"schedapp_succeed_run", "worker*"),
    ("renewal", b"schedapp_renew_leases_v6(", "worker*"),
    ("beat commit", COMMIT, "beat*"),
)
# The beat's claim statement (its reap locks with a plain FOR UPDATE SKIP LOCKED)
CLAIM = b"for update of j skip locked"


def inject(h: Harness, kind: str, rng: random.Random) -> None:
    """Inject one fault of ``kind`` and log it (faults the proxy fires later, lost replies and
    stalled claims, are logged from its events at the end)."""
    assert h.proxy is not None
    log = h.faults.append

    def held(proc: Proc, seconds: float, sig_stop: int, sig_cont: int) -> tuple[float, float]:
        t0 = time.time()
        proc.signal_group(sig_stop)
        time.sleep(seconds)
        proc.signal_group(sig_cont)
        return t0, time.time()

    if kind == "kill_worker":
        slot = rng.choice(h.slots)
        t0 = time.time()
        slot.proc.kill()
        log(oracle.Fault(kind, slot.proc.name, t0, t0, "SIGKILL, main process and pool"))
    elif kind in ("freeze_worker_short", "freeze_worker_long"):
        proc = rng.choice(h.slots).proc
        seconds = rng.uniform(*(SHORT if kind.endswith("short") else LONG))
        t0, t1 = held(proc, seconds, signal.SIGSTOP, signal.SIGCONT)
        log(oracle.Fault("freeze_worker", proc.name, t0, t1, "SIGSTOP/SIGCONT"))
    elif kind in ("partition_worker_short", "partition_worker_long"):
        proc = rng.choice(h.slots).proc
        seconds = rng.uniform(*(SHORT if kind.endswith("short") else LONG))
        t0 = time.time()
        h.proxy.blackhole(seconds, app=proc.name)
        time.sleep(seconds)
        log(oracle.Fault("partition_worker", proc.name, t0, t0 + seconds, "no DB traffic"))
    elif kind == "kill_beat":
        proc = rng.choice(h.beats)
        t0 = time.time()
        proc.kill()
        log(oracle.Fault(kind, proc.name, t0, t0))
    elif kind == "freeze_beat":
        proc = rng.choice(h.beats)
        t0, t1 = held(proc, rng.uniform(*LONG), signal.SIGSTOP, signal.SIGCONT)
        log(oracle.Fault(kind, proc.name, t0, t1))
    elif kind == "stall_claim":
        # Stopped between its claim and its COMMIT, locks held, longer than PostgreSQL's
        # idle-in-transaction timeout for beats (5 s here) or shorter.
        seconds = rng.choice([rng.uniform(*SHORT), rng.uniform(*LONG)])
        beat = rng.choice(h.beats).name
        h.proxy.stall_after(CLAIM, seconds, app=beat)
        h.armed.append(f"{time.time():.1f} stall_claim {beat} {seconds:.1f}s")
    elif kind == "broker_outage":
        seconds = rng.uniform(*LONG)
        t0 = time.time()
        h.redis.stop(kill=True)
        time.sleep(seconds)
        h.redis.start()
        log(oracle.Fault(kind, "*", t0, time.time(), "Redis killed (no persistence)"))
    elif kind == "lost_reply":
        what, pattern, app = rng.choice(LOST_REPLIES)
        h.proxy.cut_after(pattern, app=app)
        h.armed.append(f"{time.time():.1f} lost_reply {what} {app}")
    elif kind == "latency":
        seconds, duration = rng.uniform(0.1, 0.5), rng.uniform(2, 6)
        t0 = time.time()
        h.proxy.delay(seconds, duration=duration)
        time.sleep(duration)
        log(oracle.Fault(kind, "*", t0, t0 + duration, f"+{seconds:.2f}s per round trip"))


FAULT_KINDS = (
    "kill_worker",
    "freeze_worker_short",
    "freeze_worker_long",
    "partition_worker_short",
    "partition_worker_long",
    "kill_beat",
    "freeze_beat",
    "stall_claim",
    "broker_outage",
    "lost_reply",
    "latency",
)


def proxy_faults(proxy: ProxyControl) -> list[oracle.Fault]:
    """The faults the proxy fired on its own: lost replies and stalled claims."""
    found = []
    for event in proxy.events():
        if event["kind"] == "cut":
            at = event["time"]
            found.append(oracle.Fault("lost_reply", event["app"], at, at, event["statement"]))
        elif event["kind"] == "stall":
            at, seconds = event["time"], event["seconds"]
            found.append(oracle.Fault("stall_claim", event["app"], at, at + seconds))
    return found


# --- the history ----------------------------------------------------------------------------


def db_clock_offset() -> float:
    """Seconds to subtract from a database timestamp to get this host's clock (~0: one host)."""
    from django.db import connection

    samples = []
    with connection.cursor() as cursor:
        for _ in range(5):
            before = time.time()
            cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
            (db,) = cursor.fetchone()
            samples.append(float(db) - (before + time.time()) / 2)
    return sorted(samples)[len(samples) // 2]


def collect(beats_stopped_at: datetime) -> dict[str, Any]:
    """The histories the oracle needs, read from the database, on this host's clock."""
    from project.models import Execution
    from schedapp.lease import job_schedule
    from schedapp.lease.after_run import SUPERSEDED_UNSTARTED
    from schedapp.models import Job, JobRun
    from schedapp.schedules import fire_times

    offset = db_clock_offset()
    jobs = {j.pk: j for j in Job.objects.all()}
    failing = {pk for pk, j in jobs.items() if j.name.startswith("fail-")}
    executions = [
        oracle.Execution(
            job=e.job_id,
            occurrence=e.scheduled_for.isoformat(),
            token=e.token,
            node=e.worker.split("@")[0],
            started=e.started_at.timestamp(),  # the worker's clock: this host's
            lease=float(jobs[e.job_id].lease_seconds),
            finished=e.finished_at.timestamp() if e.finished_at else None,
        )
        for e in Execution.objects.filter(job_id__isnull=False, token__isnull=False)
        if e.job_id not in failing
    ]
    claims: dict[int, list[tuple[int, float]]] = defaultdict(list)
    # allow_all: each run holds its own lease; what follows a lost one is its occurrence's
    # next claim, not the job's (the job is claimed for later occurrences meanwhile).
    run_claims: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for job_id, token, at, occurrence in JobRun.objects.values_list(
        "job_id", "token", "dispatched_at", "scheduled_for"
    ):
        claims[job_id].append((token, at.timestamp() - offset))
        if jobs[job_id].overlap == "allow_all":
            run_claims[(job_id, occurrence.isoformat())].append((token, at.timestamp() - offset))
    expected: list[tuple[int, str]] = []
    never_ran = []
    firsts: dict[int, datetime] = {}
    for e in Execution.objects.filter(job_id__isnull=False).order_by("scheduled_for"):
        firsts.setdefault(e.job_id, e.scheduled_for)
    until = beats_stopped_at - timedelta(seconds=10)
    behind = []
    for job in jobs.values():
        if job.pk in failing:
            continue
        if job.run_at is not None:
            expected.append((job.pk, job.run_at.isoformat()))
            continue
        first = firsts.get(job.pk)
        if first is None:
            never_ran.append(job.name)
            continue
        # Up to the occurrence the job waits for (or runs): those before it are decided.
        # A job whose runs outlast its interval may be that far behind when beats stop.
        horizon = until
        if job.scheduled_for is not None:
            horizon = min(until, job.scheduled_for - timedelta(microseconds=1))
            if job.scheduled_for < beats_stopped_at - timedelta(seconds=BEHIND):
                behind.append(f"{job.name} waits for {job.scheduled_for.isoformat()}")
        expected.append((job.pk, first.isoformat()))
        expected.extend(
            (job.pk, t.isoformat()) for t in fire_times(job_schedule(job), first, until=horizon)
        )
    # The occurrence ledger: what was dispatched (run rows and their statuses), what was
    # recorded as not run (ranges, with their fate).
    from schedapp.models import Occurrence

    runs: dict[tuple[int, str], list[str]] = defaultdict(list)
    started: set[tuple[int, str]] = set()
    lost_tokens: dict[int, list[int]] = defaultdict(list)
    lost_at: list[tuple[int, int, float]] = []
    for job_id, at, status, token, stale, started_at, error, finished_at in (
        JobRun.objects.values_list(
            "job_id", "scheduled_for", "status", "token", "stale", "started_at", "error",
            "finished_at",
        )
    ):
        if status == "lost" and finished_at is not None:
            lost_at.append((job_id, token, finished_at.timestamp() - offset))
        if status == "skipped" and error == SUPERSEDED_UNSTARTED:
            status = "superseded"  # the reaper's: its lease lapsed after a later one came due
        runs[(job_id, at.isoformat())].append(status)
        if started_at is not None or status in ("dispatched", "running"):
            started.add((job_id, at.isoformat()))
        if status == "lost" or stale:
            lost_tokens[job_id].append(token)
    not_run = list(Occurrence.objects.values_list("job_id", "scheduled_for", "last", "fate"))
    return {
        "executions": executions,
        "claims": dict(claims),
        "run_claims": dict(run_claims),
        "lost_at": lost_at,
        "expected": expected,
        "runs": dict(runs),
        "unstarted": [key for key in runs if key not in started],
        "lost_tokens": dict(lost_tokens),
        "not_run": not_run,
        "behind": behind,
        "allow_all": {pk: j.max_concurrent for pk, j in jobs.items() if j.overlap == "allow_all"},
        "never_ran": never_ran,
        "names": {pk: j.name for pk, j in jobs.items()},
        "clock_offset": offset,
    }


def bookkeeping_problems() -> list[str]:
    """What schedapp's own rows must satisfy after the run: no job left running on an expired
    lease, every one-off finished, every dead job out of retries, no stale completion applied."""
    from schedapp.db import db_now
    from schedapp.models import Job, JobRun, JobState

    problems: list[str] = []
    jobs = {j.pk: j for j in Job.objects.all()}
    runs = list(JobRun.objects.all())
    now = db_now()
    stuck = [
        j.name
        for j in jobs.values()
        if j.state == JobState.RUNNING
        and j.lease_expires_at is not None
        and j.lease_expires_at < now
    ]
    if stuck:
        problems.append(f"jobs stuck running with expired leases: {stuck[:5]}")
    unfinished = [
        j.name
        for j in jobs.values()
        if j.run_at is not None and j.state not in (JobState.SUCCEEDED, JobState.DEAD)
    ]
    if unfinished:
        problems.append(f"one-off jobs not finished: {unfinished[:5]}")
    attempts: Counter = Counter(
        r.job_id
        for r in runs
        if oracle.counts_as_attempt(r.status, r.stale, started=r.started_at is not None)
    )
    for job in jobs.values():
        if job.state == JobState.DEAD and (
            job.retry_count != job.max_retries or attempts[job.pk] < job.max_retries + 1
        ):
            problems.append(
                f"dead job {job.name} did not exhaust its retries "
                f"({job.retry_count}/{job.max_retries}, {attempts[job.pk]} attempts)"
            )
    # Fencing held: a stale completion never applied, i.e. the job had moved on to a newer
    # token (reclaimed, reaped or cancelled) and still has it.
    for run in runs:
        if run.stale and jobs[run.job_id].token <= run.token:
            problems.append(
                f"stale completion of {jobs[run.job_id].name} (token {run.token}) holds the "
                f"job's current token {jobs[run.job_id].token}"
            )
    return problems


def dump_ledger(jobs: set[int]) -> None:
    """The runs and not-run records of ``jobs``, written to ledger.json beside the logs (the
    run's database goes away with it), for whoever reads a failed check."""
    from schedapp.models import JobRun, Occurrence

    rows = {
        "runs": list(
            JobRun.objects.filter(job_id__in=jobs)
            .order_by("job_id", "token")
            .values("job_id", "token", "scheduled_for", "status", "stale", "attempt", "error",
                    "dispatched_at", "started_at", "finished_at", "claimed_by")
        ),
        "not_run": list(
            Occurrence.objects.filter(job_id__in=jobs)
            .order_by("job_id", "scheduled_for")
            .values("job_id", "scheduled_for", "last", "count", "fate", "detail", "decided_by",
                    "recorded_at")
        ),
    }
    out = Path(os.environ["SCHEDAPP_VAR_DIR"]).parent / "ledger.json"
    out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"the ledger of jobs {sorted(jobs)} written to {out}")


def check_history(
    faults: list[oracle.Fault], beats_stopped_at: datetime, t0: float
) -> tuple[dict[str, Any], list[str]]:
    """The oracle's figures and every problem found, as sentences."""
    history = collect(beats_stopped_at)
    as_time = datetime.fromisoformat
    expected = [(job, as_time(at)) for job, at in history["expected"]]
    runs = {(job, as_time(at)): statuses for (job, at), statuses in history["runs"].items()}
    not_run = history["not_run"]
    executions = [replace(e, occurrence=as_time(e.occurrence)) for e in history["executions"]]
    # Lost: an occurrence that had to execute (no not-run record, not superseded) and never
    # did. Occurrences compare as datetimes from here on (the ledger's ranges need order).
    verdict = oracle.judge(
        executions,
        faults,
        history["claims"],
        oracle.must_execute(expected, runs, not_run),
        slack=SLACK,
        run_claims={(job, as_time(at)): c for (job, at), c in history["run_claims"].items()},
        lost_at={(job, token): at for job, token, at in history["lost_at"]},
    )
    names = history["names"]
    problems = [f"recurring job {name} never ran" for name in history["never_ran"]]
    problems += [f"job fell more than {BEHIND}s behind: {b}" for b in history["behind"]]
    for job, limit in history["allow_all"].items():
        over = oracle.overcommitted(
            [e for e in executions if e.job == job],
            limit,
            faults,
            history["lost_tokens"].get(job, ()),
        )
        if over:
            problems.append(f"{len(over)} time(s) over max_concurrent, e.g. {over[:3]}")
    problems += [
        "unexplained duplicate: " + oracle.describe(d, t0) + f" [{names.get(d.newer.job)}]"
        for d in verdict.unexplained
    ]
    if verdict.lost:
        lost = [(names[j], t) for j, t in verdict.lost]
        problems.append(f"{len(lost)} occurrence(s) never executed, e.g. {lost[:5]}")
    problems += bookkeeping_problems()
    fates = oracle.fate_problems(
        expected,
        set(runs),
        [(job, first, last) for job, first, last, _ in not_run],
        executions,
        unstarted=[(job, as_time(at)) for job, at in history["unstarted"]],
    )
    if fates:
        problems.append(f"{len(fates)} ledger problem(s), e.g. {fates[:5]}")
    if fates or verdict.lost:
        dump_ledger({job for job, _ in verdict.lost} | {int(p.split()[1]) for p in fates})
    figures = oracle.summary(verdict, faults)
    figures["occurrences"] = len(expected)
    figures["fates"] = oracle.fate_counts(expected, runs, not_run, executions)
    figures["fates_complete"] = not fates
    figures["clock_offset_ms"] = round(history["clock_offset"] * 1000, 3)
    figures["duplicate_lines"] = [oracle.describe(d, t0) for d in verdict.duplicates]
    figures["ledger_problems"] = len(fates)
    figures["ledger_records"] = len(history["not_run"])
    figures["passed"] = not problems
    return figures, problems


# --- scenarios ------------------------------------------------------------------------------


def print_unsettled() -> None:
    """Say which one-off jobs never finished, with their runs: a timeout alone explains nothing."""
    from schedapp.db import db_now
    from schedapp.models import Job, JobState

    now = db_now()
    stuck = (
        Job.objects.filter(run_at__isnull=False)
        .exclude(state__in=[JobState.SUCCEEDED, JobState.DEAD])
        .order_by("id")
    )
    print(f"unsettled one-off jobs at {now.isoformat()}: {stuck.count()}")
    for job in stuck[:20]:
        print(
            f"  {job.name} state={job.state} next_run_at={job.next_run_at} "
            f"retries={job.retry_count} lease={job.lease_expires_at} by={job.claimed_by} "
            f"token={job.token} unstarted={job.unstarted_dispatches} error={job.last_error!r:.80}"
        )
        for run in job.runs.order_by("id"):
            print(
                f"    run {run.id} attempt={run.attempt} status={run.status} "
                f"token={run.token} dispatched={run.dispatched_at} started={run.started_at} "
                f"finished={run.finished_at} lease={run.lease_expires_at} error={run.error!r:.80}"
            )


def print_in_flight(beat_exits: list[str], t0: float) -> None:
    """Say which runs were still dispatched or running once the beats stopped, who claimed
    them and how each beat exited: a run claimed and never sent has no worker."""
    from schedapp.models import JobRun

    print("beats stopped: " + ", ".join(beat_exits))
    runs = (
        JobRun.objects.filter(status__in=["dispatched", "running"], job__run_at__isnull=True)
        .select_related("job")
        .order_by("dispatched_at")
    )
    for run in runs[:20]:
        print(
            f"  {run.job.name} token={run.token} status={run.status} by={run.claimed_by} "
            f"dispatched={run.dispatched_at.timestamp() - t0:.1f}s worker={run.worker or '-'} "
            f"started={run.started_at} lease={run.lease_expires_at}"
        )


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    processes.wait_until(predicate, timeout, interval=0.5, message=what)


def run_chaos(
    duration: float,
    seed: int,
    workdir: Path,
    profile: str = "mix",
    faults_on: bool = True,
    workers_exit_at_end: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """One seeded run: the figures of its history and every problem found. With
    ``workers_exit_at_end`` every worker is killed as the faults end, after the supervisor's
    last look inside the window: the history must still settle (the supervisor goes on)."""
    rng = random.Random(seed)
    kinds: tuple[str, ...] = FAULT_KINDS if faults_on else ()
    if profile == "prefetch":  # one process, Celery's default prefetch, long jobs: no faults
        h = Harness(workdir, beats=1, workers=1, concurrency=1, prefetch=(4,), proxy=True)
        kinds = ()
    elif profile == "ledger":  # the overlap jobs and the paused one alone, no fault
        h = Harness(workdir, beats=1, workers=1, concurrency=6, prefetch=(1,), proxy=True)
        kinds = ()
    elif profile == "broker":  # long jobs running through one Redis outage longer than a lease
        h = Harness(workdir, beats=1, workers=1, concurrency=2, prefetch=(1,), proxy=True)
        kinds = ("broker_outage",)
    else:
        # Six slots a worker: the overlap jobs keep about seven busy between them.
        h = Harness(workdir, concurrency=6, prefetch=(4, 1), proxy=True)
    try:
        h.start_servers()
        h.start_processes()
        if profile == "prefetch":
            counts = schedule_prefetch_mix(rng)
        elif profile == "broker":
            counts = schedule_long_mix()
        elif profile == "ledger":
            counts = schedule_ledger_mix(rng)
        else:
            counts = schedule_mix(duration, scale=duration / 120, rng=rng)
        from schedapp.db import db_now, reset_connection
        from schedapp.models import Job, JobRun, JobState

        t0 = time.time()
        started = time.monotonic()
        restarts = []
        print(f"chaos: seed {seed}, {duration:.0f}s of faults, jobs {counts}", flush=True)
        next_fault = started + 5 + rng.uniform(2, 6)
        actions = ledger_actions(duration, rng) if profile in ("mix", "ledger") else []
        while time.monotonic() - started < duration:
            if actions and time.monotonic() - started >= actions[0][0]:
                _, _, action = actions.pop(0)
                act(action)
                if actions:  # the pause lasts its span after it began, however late it began
                    actions[0] = (time.monotonic() - started + actions[0][1], 0.0, actions[0][2])
                restarts.append(f"{time.time() - t0:7.1f}s {action} {PAUSED}")
            if kinds and time.monotonic() >= next_fault:
                inject(h, rng.choice(kinds), rng)
                next_fault = time.monotonic() + rng.uniform(2, 6)
                if profile == "broker":
                    next_fault = float("inf")  # one outage
            for name in h.supervise():
                restarts.append(f"{time.time() - t0:7.1f}s restarted {name}")
            time.sleep(0.5)
        for _, _, action in actions:  # a resume the faults' window ended before
            act(action)
            restarts.append(f"{time.time() - t0:7.1f}s {action} {PAUSED} (after the faults)")
        assert h.proxy is not None
        h.proxy.clear()  # a lost reply or a stall still armed would fire after the faults
        reset_connection()
        h.supervise()
        if workers_exit_at_end:  # as kombu's exit after a late Redis restart does, at worst
            for slot in h.slots:
                t_kill = time.time()
                slot.proc.kill()
                h.faults.append(
                    oracle.Fault("kill_worker", slot.proc.name, t_kill, t_kill, "at the end")
                )

        def settled() -> bool:
            # The supervisor keeps going while the history settles, as systemd would: a worker
            # that exits after the faults (kombu 5.7 exits some workers on a Redis restart once
            # their tasks end, after the last check above) is restarted, or nothing runs.
            for name in h.supervise():
                restarts.append(f"{time.time() - t0:7.1f}s restarted {name} (settling)")
            reset_connection()
            try:
                return not (
                    Job.objects.filter(run_at__isnull=False)
                    .exclude(state__in=[JobState.SUCCEEDED, JobState.DEAD])
                    .exists()
                )
            except Exception:
                return False

        try:
            wait_until(settled, timeout=180, what="every one-off job to finish")
        except TimeoutError:
            print_unsettled()
            raise
        time.sleep(LEASE + 2)  # a copy still buffered somewhere runs now, if there is one
        beats_stopped_at = db_now()
        beat_exits = []
        for beat in h.beats:
            t_stop = time.monotonic()
            beat.stop()
            beat_exits.append(
                f"{beat.name} exit {beat.popen.returncode} in {time.monotonic() - t_stop:.1f}s"
            )
        # Every run dispatched before the beats stopped ends (an allow_all job has runs in
        # flight while the job itself is scheduled); one that does not is the oracle's to judge.
        try:
            wait_until(
                lambda: not JobRun.objects.filter(
                    status__in=["dispatched", "running"], job__run_at__isnull=True
                ).exists(),
                timeout=60,
                what="in-flight runs to finish",
            )
        except TimeoutError as exc:
            print(f"in-flight runs still active: {exc}")
            print_in_flight(beat_exits, t0)
        for worker in h.workers:
            worker.stop()
        faults = sorted(h.faults + proxy_faults(h.proxy), key=lambda f: f.start)
        print("faults:")
        for f in faults:
            print(f"  {f.start - t0:7.1f}s {f.kind} {f.target} {f.duration:.1f}s {f.detail}")
        for line in restarts:
            print("  " + line)
        print(f"proxy faults armed: {len(h.armed)}, fired: {len(proxy_faults(h.proxy))}")
        figures, problems = check_history(faults, beats_stopped_at, t0)
        figures["proxy_faults_armed"] = h.armed
        print("duplicates:")
        for line in figures["duplicate_lines"]:
            print("  " + line)
        figures.update(seed=seed, minutes=round(duration / 60, 2), jobs=counts, profile=profile)
        print("occurrences checked per fate: " + json.dumps(figures["fates"]))
        print_table([figures])
        return figures, problems
    finally:
        h.stop()


def print_table(runs: list[dict[str, Any]]) -> str:
    """The per-seed table (Markdown), printed and returned."""
    kinds = sorted({k for r in runs for k in r["faults"]})
    headers = [
        "seed",
        "minutes",
        "executions",
        "duplicates",
        "attributed",
        "unexplained",
        "lost",
        "ledger problems",
        "fates complete",
        "passed",
        "faults per kind",
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in runs:
        per_kind = ", ".join(f"{k} {r['faults'][k]}" for k in kinds if k in r["faults"])
        cells = [
            r["seed"],
            r["minutes"],
            r["executions"],
            r["duplicates"],
            r["attributed"],
            r["unexplained"],
            r["lost"],
            r.get("ledger_problems", "-"),
            {True: "yes", False: "NO"}.get(r.get("fates_complete"), "-"),
            "yes" if r["passed"] else "NO",
            per_kind or "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def run_redis_outage(workdir: Path) -> list[str]:
    """Redis goes away: beats keep running and retry; nothing claimed is lost."""
    h = Harness(workdir, beats=1, workers=1)
    h.start_servers()
    problems: list[str] = []
    try:
        h.start_processes()
        from project.models import Execution
        from schedapp import api
        from schedapp.db import db_now
        from schedapp.models import JobRun

        beat, worker = h.beats[0], h.workers[0]
        api.schedule("project.tasks.record", run_at=db_now(), name="before")
        wait_until(lambda: Execution.objects.filter(label="").exists(), 20, "first run")
        h.redis.stop(kill=True)
        print("redis stopped")
        api.schedule_many(
            {
                "task": "project.tasks.record",
                "run_at": db_now(),
                "name": f"during-{i}",
                "kwargs": {"label": f"during-{i}"},
            }
            for i in range(20)
        )
        time.sleep(8)
        if not beat.alive():
            problems.append("the beat died while Redis was down")
        if "publishing" not in beat.log():
            problems.append("the beat did not report the failed publish")
        unpublished = JobRun.objects.filter(status="lost", error__startswith="not published")
        print(f"while down: {unpublished.count()} claims released after failed publishes")
        if not unpublished.exists():
            problems.append("no claim was released after a failed publish")
        h.redis.start()
        print("redis started")
        wait_until(
            lambda: Execution.objects.filter(label__startswith="during-").count() >= 20,
            60,
            "the jobs scheduled during the outage to run",
        )
        time.sleep(3)
        per_job = Counter(
            Execution.objects.filter(label__startswith="during-").values_list("label", flat=True)
        )
        if sorted(per_job.values()) != [1] * 20:
            problems.append(f"jobs did not run exactly once: {per_job}")
        if not (beat.alive() and worker.alive()):
            problems.append("a process died")
        print(f"after: {len(per_job)} jobs ran once each; beat pid {beat.pid} never restarted")
    finally:
        h.stop()
    return problems


def run_postgres_outage(workdir: Path) -> list[str]:
    """PostgreSQL restarts while a job runs: beats and worker hooks wait and reconnect,
    nothing dispatched is forgotten, nothing runs twice."""
    h = Harness(workdir, beats=2, workers=1)
    h.start_servers()
    problems: list[str] = []
    try:
        h.start_processes()
        from project.models import Execution
        from schedapp import api
        from schedapp.db import db_now, reset_connection
        from schedapp.models import Job, JobRun

        long_job = api.schedule(
            "project.tasks.record",
            run_at=db_now(),
            name="long",
            kwargs={"label": "long", "sleep": 8},
            lease_seconds=60,
        )
        api.schedule("project.tasks.record", interval=2, name="every2", kwargs={"label": "every2"})
        api.schedule_many(
            {
                "task": "project.tasks.record",
                "run_at": db_now() + timedelta(seconds=6),
                "name": f"soon-{i}",
                "kwargs": {"label": f"soon-{i}"},
            }
            for i in range(10)
        )
        wait_until(
            lambda: Execution.objects.filter(label="long").exists(),
            20,
            "the long job to be running (it records its start)",
        )
        pids = [p.pid for p in h.beats + h.workers]
        h.pg.stop(mode="immediate")
        print("postgres stopped (immediate)")
        time.sleep(6)
        h.pg.start()
        print("postgres started")
        reset_connection()
        wait_until(
            lambda: Job.objects.get(pk=long_job.pk).state == "succeeded",
            60,
            "the long job's completion to be recorded",
        )
        wait_until(
            lambda: Execution.objects.filter(label__startswith="soon-").count() >= 10,
            60,
            "the one-off jobs to run",
        )
        time.sleep(5)
        long_runs = list(JobRun.objects.filter(job=long_job))
        if [r.status for r in long_runs] != ["succeeded"]:
            problems.append(f"the long job's runs: {[r.status for r in long_runs]}")
        if Execution.objects.filter(label="long").count() != 1:
            problems.append("the long job ran more than once")
        soon = Counter(
            Execution.objects.filter(label__startswith="soon-").values_list("label", flat=True)
        )
        if sorted(soon.values()) != [1] * 10:
            problems.append(f"one-off jobs did not run exactly once: {soon}")
        before = Execution.objects.filter(label="every2").count()
        time.sleep(4)
        if Execution.objects.filter(label="every2").count() <= before:
            problems.append("the interval job stopped after the restart")
        if [p.pid for p in h.beats + h.workers] != pids or not all(
            p.alive() for p in h.beats + h.workers
        ):
            problems.append("a beat or worker died (crash loop)")
        logs = "".join(p.log() for p in h.beats)
        print(
            f"beats reported the outage: {'database unavailable' in logs}; "
            f"long job ran once and its completion survived the restart"
        )
    finally:
        h.stop()
    return problems


def seed_list(text: str) -> list[int]:
    """``--seeds 10``: seeds 1 to 10; ``--seeds 3,5,8``: those."""
    if "," in text:
        return [int(x) for x in text.split(",") if x]
    return list(range(1, int(text) + 1))


def run_seeds(seeds: list[int], args: argparse.Namespace) -> int:
    """One process per seed (Django's settings are read once per process); the table of all
    of them goes to bench/results/chaos.json."""
    runs, codes = [], []
    for seed in seeds:
        out = Path(tempfile.mkstemp(prefix=f"chaos-{seed}-", suffix=".json")[1])
        argv = [
            sys.executable,
            "-m",
            "bench.chaos",
            "--duration",
            str(args.duration),
            "--seed",
            str(seed),
            "--profile",
            args.profile,
            "--out",
            str(out),
        ]
        if args.defect:
            argv += ["--defect", args.defect]
        codes.append(subprocess.call(argv, cwd=ROOT))
        try:
            runs.append(json.loads(out.read_text()))
        except ValueError:
            runs.append({"seed": seed, "crashed": True})
        out.unlink(missing_ok=True)
    done = [r for r in runs if "crashed" not in r]
    print(f"\nchaos seeds {seeds}: exit codes {codes}")
    table = print_table(done) if done else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "chaos.json").write_text(
        json.dumps(
            {
                "command": " ".join(["python -m bench.chaos", *sys.argv[1:]]),
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "lease_seconds": LEASE,
                "slack_seconds": SLACK,
                "defect": args.defect or None,
                "runs": runs,
                "table": table,
            },
            indent=2,
            default=str,
        )
    )
    print(f"written {RESULTS / 'chaos.json'}")
    return 1 if any(codes) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", default="chaos", choices=["chaos", "redis-outage", "postgres-outage"]
    )
    parser.add_argument("--duration", type=float, default=120, help="seconds of faults")
    parser.add_argument("--minutes", type=float, help="minutes of faults (overrides --duration)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", default="", help="N (seeds 1..N) or a,b,c: one run each")
    parser.add_argument(
        "--profile",
        default="mix",
        choices=["mix", "prefetch", "broker", "ledger"],
        help="mix: every fault kind; prefetch: one worker with Celery's default prefetch, "
        "long jobs, no fault; broker: long jobs running through one Redis outage; ledger: "
        "the overlap jobs and a paused one, no fault",
    )
    parser.add_argument("--defect", default="", help="put a known defect back (bench/defects.py)")
    parser.add_argument(
        "--workers-exit-at-end",
        action="store_true",
        help="kill every worker as the faults end (kombu 5.7 workers exit after a Redis "
        "restart once their tasks end): the supervisor must restart them while it settles",
    )
    parser.add_argument("--out", default="", help="write this run's figures here (JSON)")
    args = parser.parse_args()
    if args.minutes is not None:
        args.duration = args.minutes * 60
    if args.defect:
        from bench.defects import DEFECTS

        if args.defect not in DEFECTS:
            parser.error(f"--defect must be one of {', '.join(DEFECTS)}")
        os.environ["CHAOS_DEFECT"] = args.defect  # the workers inherit it
    if args.seeds:
        return run_seeds(seed_list(args.seeds), args)
    workdir = Path(tempfile.mkdtemp(prefix="schedapp-chaos-"))
    if args.scenario == "chaos":
        figures, problems = run_chaos(
            args.duration,
            args.seed,
            workdir,
            args.profile,
            workers_exit_at_end=args.workers_exit_at_end,
        )
        figures["problems"] = problems
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2, default=str))
    elif args.scenario == "redis-outage":
        problems = run_redis_outage(workdir)
    else:
        problems = run_postgres_outage(workdir)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(
        f"{args.scenario} seed {args.seed}: {'FAILED' if problems else 'passed'} "
        f"(logs in {workdir})"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
