#!/usr/bin/env python
"""Chaos runs: real beats and workers under injected faults, then a check of the history.

    python bench/chaos.py --duration 120 --seed 1          # the short run CI does
    python bench/chaos.py --duration 1200 --seeds 1,2,3    # the long run (bench/README.md)
    python bench/chaos.py --scenario redis-outage          # Redis down, then back
    python bench/chaos.py --scenario postgres-outage       # PostgreSQL restarted mid-flight

Each run starts a private PostgreSQL cluster and a private Redis (so it may kill and restart
them freely), 3 beats and 2 prefork workers, schedules a mix of jobs (one-off jobs spread over
the window, interval and cron jobs, long jobs that need heartbeats, flaky jobs that retry,
jobs that always fail), and injects faults on a seeded plan: SIGKILL of a beat or a worker,
SIGSTOP of a beat for longer than a lease, a Redis restart (every message lost), a PostgreSQL
restart. A supervisor restarts what died. Every execution is recorded by the task itself.
The history check then demands: no occurrence lost, every duplicate explained by a recorded
fault, no job stuck with an expired lease, every dead job out of retries, no stale completion
applied. Exit status 0 means every check passed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fleet import Fleet, Proc  # noqa: E402
from tests.servers import PrivatePostgres, PrivateRedis  # noqa: E402

LEASE = 5  # seconds: short, so that recovery happens well inside the run


@dataclass
class Faults:
    counts: Counter = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)

    def note(self, kind: str, detail: str, started: float) -> None:
        self.counts[kind] += 1
        self.log.append(f"{time.monotonic() - started:7.1f}s {kind}: {detail}")


class Harness:
    """Servers, processes and a supervisor that restarts whatever died."""

    def __init__(self, workdir: Path, beats: int = 3, workers: int = 2) -> None:
        self.workdir = workdir
        self.pg = PrivatePostgres()
        self.redis = PrivateRedis()
        self.n_beats, self.n_workers = beats, workers
        self.beats: list[Proc] = []
        self.workers: list[Proc] = []
        self.fleet: Fleet | None = None

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
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.fleet = Fleet(self.workdir, env)

    def start_processes(self) -> None:
        assert self.fleet is not None
        self.beats = [self.fleet.beat() for _ in range(self.n_beats)]
        self.workers = [
            self.fleet.worker(concurrency=3, heartbeat=1) for _ in range(self.n_workers)
        ]

    def supervise(self) -> list[str]:
        """Restart dead processes, as systemd or Kubernetes would."""
        assert self.fleet is not None
        restarted = []
        for group, start in (
            (self.beats, self.fleet.beat),
            (self.workers, lambda: self.fleet.worker(concurrency=3, heartbeat=1)),
        ):  # type: ignore[union-attr]
            for i, proc in enumerate(group):
                if not proc.alive():
                    group[i] = start()
                    restarted.append(proc.name)
        return restarted

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop_all()
        self.redis.stop(kill=True)
        self.pg.destroy()


# --- the job mix and the fault plan -------------------------------------------------------


def schedule_mix(window: float, scale: float, rng: random.Random) -> dict[str, int]:
    from schedapp import api
    from schedapp.db import db_now

    now = db_now()
    counts: Counter = Counter()
    # One-off kinds, spread over the window: (name, how many, task, kwargs, options).
    one_offs = [
        ("once", int(1500 * scale), "project.tasks.record", {}, {"lease_seconds": LEASE}),
        (
            "long",
            max(2, int(8 * scale)),
            "project.tasks.record",
            {"sleep": 8},
            {"lease_seconds": 3, "max_retries": 10, "retry_backoff": 1},
        ),
        (
            "flaky",
            max(4, int(30 * scale)),
            "project.tasks.flaky",
            {"failures": 2},
            {"max_retries": 6, "retry_backoff": 1, "lease_seconds": LEASE},
        ),
        (
            "fail",
            max(2, int(6 * scale)),
            "project.tasks.fail",
            {},
            {"max_retries": 2, "retry_backoff": 1, "lease_seconds": LEASE},
        ),
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
                "lease_seconds": LEASE,
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
                "lease_seconds": LEASE,
            }
        )
    api.schedule_many(specs)
    for spec in specs:
        counts[spec["name"].split("-")[0]] += 1
    return dict(counts)


def inject(h: Harness, kind: str, rng: random.Random, faults: Faults, started: float) -> None:
    if kind == "kill_beat":
        proc = rng.choice(h.beats)
        proc.kill()
        faults.note(kind, proc.name, started)
    elif kind == "kill_worker":
        proc = rng.choice(h.workers)
        proc.kill()
        faults.note(kind, f"{proc.name} (main process and pool children)", started)
    elif kind == "pause_beat":
        proc = rng.choice(h.beats)
        pause = LEASE + 3 + rng.random() * 3
        proc.signal_group(signal.SIGSTOP)
        faults.note(kind, f"{proc.name} SIGSTOP for {pause:.1f}s", started)
        time.sleep(pause)
        proc.signal_group(signal.SIGCONT)
    elif kind == "restart_redis":
        down = 1 + rng.random() * 3
        h.redis.restart(down_for=down)
        faults.note(kind, f"down {down:.1f}s, every queued message lost", started)
    elif kind == "restart_postgres":
        down = 1 + rng.random() * 3
        h.pg.restart(down_for=down, mode="immediate")
        faults.note(kind, f"immediate shutdown, down {down:.1f}s", started)


FAULT_KINDS = ("kill_beat", "kill_worker", "pause_beat", "restart_redis", "restart_postgres")


# --- the history check ----------------------------------------------------------------------


def check_history(counts: dict[str, int], faults: Faults, beats_stopped_at) -> list[str]:
    """Every problem found, as sentences; the table is printed as a side effect."""

    from project.models import Execution
    from schedapp.db import db_now
    from schedapp.models import Job, JobRun, JobState, RunStatus
    from schedapp.schedules import fire_times

    problems: list[str] = []
    jobs = {j.pk: j for j in Job.objects.all()}
    runs_by_token = {(r.job_id, r.token): r for r in JobRun.objects.all()}
    executions = defaultdict(list)
    for e in Execution.objects.exclude(label__startswith="fail-"):
        if e.finished_at is not None:
            executions[(e.job_id, e.scheduled_for)].append(e)

    # 1. Nothing lost: every due occurrence executed at least once (or was dead-lettered)
    expected: list[tuple[int, object]] = []
    for job in jobs.values():
        if job.name.startswith("fail-"):
            continue
        if job.run_at is not None:
            if job.state == JobState.DEAD:
                continue
            expected.append((job.pk, job.run_at))
        else:
            from schedapp.claims import job_schedule

            first = Execution.objects.filter(job_id=job.pk).order_by("scheduled_for").first()
            if first is None:
                problems.append(f"recurring job {job.name} never ran")
                continue
            until = beats_stopped_at - timedelta(seconds=10)
            expected.append((job.pk, first.scheduled_for))
            expected.extend(
                (job.pk, t) for t in fire_times(job_schedule(job), first.scheduled_for, until=until)
            )
    lost = [(jobs[j].name, t) for j, t in expected if not executions.get((j, t))]
    if lost:
        problems.append(f"{len(lost)} occurrence(s) never executed, e.g. {lost[:5]}")

    # 2. Every duplicate explained by a recorded fault
    causes: Counter = Counter()
    duplicates = 0
    for (job_id, _when), group in executions.items():
        if len(group) < 2:
            continue
        duplicates += len(group) - 1
        tokens = sorted(e.token for e in group)
        if len(set(tokens)) < len(tokens):
            causes["same claim executed twice (door failed)"] += 1
            problems.append(f"job {jobs[job_id].name}: one claim executed twice {tokens}")
            continue
        for token in tokens[:-1]:
            run = runs_by_token.get((job_id, token))
            if run is not None and run.stale:
                causes["lease lost while running (completion stale)"] += 1
            elif run is not None and run.status == RunStatus.LOST:
                causes["lease expired (run lost: worker, beat or database fault)"] += 1
            else:
                causes["unexplained"] += 1
                problems.append(
                    f"job {jobs[job_id].name}: duplicate of token {token} "
                    f"({run.status if run else 'no run'}) not explained"
                )

    # 3. No job left running on an expired lease; every one-off job finished
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

    # 4. Every dead job exhausted its retries
    for job in jobs.values():
        if job.state != JobState.DEAD:
            continue
        attempts = [
            r
            for r in runs_by_token.values()
            if r.job_id == job.pk and r.status in (RunStatus.FAILED, RunStatus.LOST) and not r.stale
        ]
        if job.retry_count != job.max_retries or len(attempts) < job.max_retries + 1:
            problems.append(
                f"dead job {job.name} did not exhaust its retries "
                f"({job.retry_count}/{job.max_retries}, {len(attempts)} attempts)"
            )

    # 5. Fencing held: a stale completion never applied, i.e. the job had moved on to a newer
    # token (reclaimed, reaped or cancelled) and still has it. (A stale run can be the job's
    # latest run: a reaper that dead-letters the job bumps the token without a new claim.)
    for (job_id, token), run in runs_by_token.items():
        if run.stale and jobs[job_id].token <= token:
            problems.append(
                f"stale completion of {jobs[job_id].name} (token {token}) holds the "
                f"job's current token {jobs[job_id].token}"
            )

    lags = sorted(
        (r.dispatched_at - r.due_at).total_seconds()
        for r in runs_by_token.values()
        if r.attempt == 1
    )
    rows = [
        ("jobs", len(jobs), ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))),
        ("occurrences checked", len(expected), ""),
        ("executions", sum(len(g) for g in executions.values()), ""),
        ("duplicates", duplicates, "; ".join(f"{v} {k}" for k, v in causes.items()) or "-"),
        ("lost", len(lost), "must be 0"),
        (
            "runs lost / stale",
            sum(r.status == RunStatus.LOST for r in runs_by_token.values()),
            f"{sum(r.stale for r in runs_by_token.values())} stale completions (not applied)",
        ),
        ("dead jobs", sum(j.state == JobState.DEAD for j in jobs.values()), "always-failing"),
        (
            "faults injected",
            sum(faults.counts.values()),
            ", ".join(f"{k} {v}" for k, v in sorted(faults.counts.items())),
        ),
        (
            "max dispatch lag",
            f"{max(lags, default=0):.2f}s",
            f"p50 {lags[len(lags) // 2] if lags else 0:.3f}s",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value!s:>8}  {note}")
    return problems


# --- scenarios ------------------------------------------------------------------------------


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def run_chaos(duration: float, seed: int, workdir: Path) -> list[str]:
    rng = random.Random(seed)
    h = Harness(workdir)
    h.start_servers()
    try:
        h.start_processes()
        counts = schedule_mix(duration, scale=duration / 120, rng=rng)
        from schedapp.db import db_now, reset_connection
        from schedapp.models import Job, JobRun, JobState

        faults = Faults()
        started = time.monotonic()
        print(f"chaos: seed {seed}, {duration:.0f}s of faults, jobs {counts}")
        next_fault = started + 5 + rng.uniform(2, 6)
        while time.monotonic() - started < duration:
            if time.monotonic() >= next_fault:
                inject(h, rng.choice(FAULT_KINDS), rng, faults, started)
                next_fault = time.monotonic() + rng.uniform(3, 9)
            for name in h.supervise():
                faults.log.append(f"{time.monotonic() - started:7.1f}s restarted {name}")
            time.sleep(0.5)
        reset_connection()  # ours may have died with a PostgreSQL restart
        h.supervise()

        def settled() -> bool:
            reset_connection()
            try:
                once_open = (
                    Job.objects.filter(run_at__isnull=False)
                    .exclude(state__in=[JobState.SUCCEEDED, JobState.DEAD])
                    .exists()
                )
                return not once_open
            except Exception:
                return False

        wait_until(settled, timeout=120, what="every one-off job to finish")
        beats_stopped_at = db_now()
        for beat in h.beats:
            beat.stop()
        wait_until(
            lambda: (
                not JobRun.objects.filter(
                    status__in=["dispatched", "running"], job__run_at__isnull=True
                ).exists()
                or not Job.objects.filter(state=JobState.RUNNING).exists()
            ),
            timeout=60,
            what="in-flight runs to finish",
        )
        for worker in h.workers:
            worker.stop()
        print("faults:")
        for line in faults.log:
            print("  " + line)
        print("history:")
        return check_history(counts, faults, beats_stopped_at)
    finally:
        h.stop()


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", default="chaos", choices=["chaos", "redis-outage", "postgres-outage"]
    )
    parser.add_argument("--duration", type=float, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", default="", help="comma-separated: several chaos runs")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    if len(seeds) > 1:  # one process per run: Django's settings are read once per process
        import subprocess

        codes = [
            subprocess.call(
                [sys.executable, __file__, "--duration", str(args.duration), "--seed", str(seed)]
            )
            for seed in seeds
        ]
        print(f"chaos seeds {seeds}: exit codes {codes}")
        return 1 if any(codes) else 0
    failed = False
    for seed in seeds if args.scenario == "chaos" else [0]:
        workdir = Path(tempfile.mkdtemp(prefix="schedapp-chaos-"))
        if args.scenario == "chaos":
            problems = run_chaos(args.duration, seed, workdir)
        elif args.scenario == "redis-outage":
            problems = run_redis_outage(workdir)
        else:
            problems = run_postgres_outage(workdir)
        for problem in problems:
            print(f"PROBLEM: {problem}")
        print(
            f"{args.scenario} seed {seed}: {'FAILED' if problems else 'passed'} (logs in {workdir})"
        )
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
