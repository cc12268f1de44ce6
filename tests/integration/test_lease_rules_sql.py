"""The lease rules' tables (``schedapp/lease/rules.py``) against the PL/pgSQL that implements
them again on PostgreSQL's hot path, case by case (DESIGN rule 22).

Each table's inputs are enumerated as a cross product (job state, token current or not, the
lease at its boundaries, unstarted dispatches, the run's status, admission, started, stale),
one job and run row per case, all in the test's transaction, whose ``now()`` every case shares.
Then the PostgreSQL store (``schedapp_admit_run``, ``schedapp_renew_leases``,
``schedapp_succeed_run``) and the portable store's ORM functions (database-agnostic, run here
on PostgreSQL) are each called on every case, in a savepoint rolled back after, and both their
verdicts and the rows they leave are compared with what the rules decide. A mismatch names the
case, so the day the SQL or the table changes alone, this says which cells differ.

The PostgreSQL tables run in full. The portable store's (the same ORM functions that run on
SQLite) run on a sample in the default run and in full under ``exhaustive``: ``stratified``.

The one disagreement it found (the error a run refused for an expired lease was closed with:
the portable store added "; it will be dispatched again") is fixed: the text is the table's
too (``rules.skipped_error``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction

from schedapp import api
from schedapp.db import db_now
from schedapp.lease import complete_run, rules
from schedapp.message import task_id_for
from schedapp.models import Calendar, Job, JobRun, Occurrence
from schedapp.policies import ALLOW_ALL, OVERLAP_POLICIES, end_decides
from schedapp.store import PostgreSQLStore, portable

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]

LEASE = 60  # seconds: five sixths of it is a whole 50 s
TOKEN = 5  # the job's current token; a stale message carries TOKEN - 1
WORKER = "w-diff"
OLD_WORKER = "w-before"

# The lease at its boundaries, as (label, offset from now); None: no lease.
LEASES: tuple[tuple[str, timedelta | None], ...] = (
    ("none", None),
    ("expired", timedelta(seconds=-1)),
    ("ends now", timedelta(0)),
    ("just alive", timedelta(microseconds=1)),
    ("under 5/6 left", timedelta(seconds=LEASE * 5 / 6) - timedelta(microseconds=1)),
    ("5/6 left", timedelta(seconds=LEASE * 5 / 6)),
    ("a whole lease", timedelta(seconds=LEASE)),
    ("over a lease", timedelta(seconds=LEASE, microseconds=1)),
)
JOB_STATES = ("running", "paused", "scheduled", "dead")

START_DEADLINE = timedelta(seconds=30)
# The job's (skip_late, start_deadline) and how long before now the run's occurrence was, by
# label; "none" leaves the template's (no start deadline, the run's occurrence its own).
DEADLINES: dict[str, tuple[bool, timedelta | None, timedelta | None]] = {
    "none": (False, None, None),
    "not skipping": (False, START_DEADLINE, 2 * START_DEADLINE),
    "at the deadline": (True, START_DEADLINE, START_DEADLINE),
    "past it": (True, START_DEADLINE, START_DEADLINE + timedelta(microseconds=1)),
}
RUN_KINDS = ("scheduled", "retry", "manual", "backfill")
RUN_STATUSES = ("dispatched", "running", "succeeded", "failed", "lost", "skipped", "cancelled")


@dataclass(frozen=True)
class Case:
    state: str
    current: bool  # the message's token is the job's
    lease: str
    unstarted: int
    run: str | None  # the run's status; None: no run of this token
    same_admission: bool = False  # the run's admission is this door call's
    started: bool = False
    stale: bool = False
    same_schedule: bool = True
    overlap: str = "buffer_one"
    fixed_delay: bool = False
    next_passed: bool = False  # the next occurrence the success passes is not after now()
    dst_policy: str = "gap_end+first"  # a worker's next occurrence assumes the default
    calendar: bool = False  # the job follows a calendar (its next run is not a worker's)
    own: bool = False  # the run holds a lease of its own (allow_all): its row decides
    run_lease: str = "none"  # that lease, as a label of LEASES
    deadline: str = "none"  # the job's start deadline and the run's occurrence: DEADLINES
    kind: str = "scheduled"  # the run's kind; a retry is attempt 2

    @property
    def attempt(self) -> int:
        return 2 if self.kind == "retry" else 1

    @property
    def token(self) -> int:
        return TOKEN if self.current else TOKEN - 1

    def possible(self) -> bool:
        # the database refuses a running job without a lease (schedapp_job_running_has_lease)
        return not (self.state == "running" and self.lease == "none")


def enumerate_cases(**axes: Iterable[Any]) -> list[Case]:
    names = list(axes)
    cases = [
        Case(**dict(zip(names, values, strict=True)))
        for values in itertools.product(*axes.values())
    ]
    return [c for c in cases if c.possible()]


DOOR_CASES = enumerate_cases(
    state=JOB_STATES,
    current=(True, False),
    lease=[label for label, _ in LEASES],
    unstarted=(0, 1),
    run=(None, *RUN_STATUSES),
    same_admission=(True, False),
)
DOOR_CASES = [replace(c, started=c.run not in (None, "dispatched")) for c in DOOR_CASES]
RENEW_CASES = enumerate_cases(
    state=JOB_STATES,
    current=(True, False),
    lease=("none", "expired", "just alive"),
    unstarted=(0,),
    run=(None, *RUN_STATUSES),
    started=(True, False),
    stale=(True, False),
)
SUCCESS_CASES = enumerate_cases(
    state=JOB_STATES,
    current=(True, False),
    lease=("none", "just alive"),
    unstarted=(0,),
    run=(None, *RUN_STATUSES),
    same_schedule=(True, False),
)
# Runs with a lease of their own (allow_all): the job moved on at the claim (no job lease, the
# token no longer the run's as often as not), the run's lease at its boundaries.
OWN_JOB_STATES = ("scheduled", "paused", "cancelled", "dead", "succeeded")
OWN_DOOR_CASES = [
    replace(c, started=c.run not in (None, "dispatched"))
    for c in enumerate_cases(
        state=OWN_JOB_STATES,
        current=(True, False),
        lease=("none",),
        unstarted=(0,),
        run=RUN_STATUSES,
        same_admission=(True, False),
        own=(True,),
        run_lease=[label for label, _ in LEASES],
    )
]
# The door's start deadline (v5): the job's skip_late and start_deadline, the run's occurrence
# at its boundary, its kind (a retry, a run now and a backfill are not subject to it), across
# the rows of the door that come before it and after it.
LATE_DOOR_CASES = [
    replace(c, started=c.run not in (None, "dispatched"))
    for c in enumerate_cases(
        state=("running", "paused", "scheduled"),
        current=(True, False),
        lease=("expired", "a whole lease"),
        unstarted=(0,),
        run=(None, "dispatched", "running"),
        same_admission=(True, False),
        deadline=list(DEADLINES),
        kind=RUN_KINDS,
    )
]
OWN_LATE_DOOR_CASES = [
    replace(c, started=c.run != "dispatched")
    for c in enumerate_cases(
        state=("scheduled", "paused", "cancelled"),
        current=(True,),
        lease=("none",),
        unstarted=(0,),
        run=("dispatched", "running", "skipped"),
        same_admission=(True, False),
        own=(True,),
        run_lease=("expired", "just alive", "a whole lease"),
        deadline=list(DEADLINES),
        kind=RUN_KINDS,
    )
]
OWN_RENEW_CASES = enumerate_cases(
    state=OWN_JOB_STATES,
    current=(True, False),
    lease=("none",),
    unstarted=(0,),
    run=RUN_STATUSES,
    started=(True, False),
    stale=(True, False),
    own=(True,),
    run_lease=("none", "expired", "just alive"),
)
# The common case of a success under every overlap policy and interval kind, the next
# occurrence before or after now(): whether the one call applies (end_decides).
END_CASES = enumerate_cases(
    state=("running", "paused"),
    current=(True,),
    lease=("just alive",),
    unstarted=(0,),
    run=("running",),
    overlap=(*OVERLAP_POLICIES, ALLOW_ALL),
    fixed_delay=(False, True),
    next_passed=(False, True),
    dst_policy=("gap_end+first", "celery"),
    calendar=(False, True),
)


def lease_at(label: str, now: datetime) -> datetime | None:
    offset = dict(LEASES)[label]
    return None if offset is None else now + offset


@pytest.fixture
def now() -> datetime:
    return db_now()  # the transaction's: every statement of the test sees this now()


def build(cases: list[Case], now: datetime) -> list[int]:
    """One job (and the run of the case's token, if any) per case; their ids, in order."""
    template = api.schedule(
        "project.tasks.record",
        interval=timedelta(seconds=60),
        name="rules-template",
        lease_seconds=LEASE,
    )
    fields = Job.objects.filter(pk=template.pk).values().first()
    assert fields is not None
    calendar = Calendar.objects.create(name="rules-weekends", definition={"weekdays": ["sun"]})
    del fields["id"]
    jobs = Job.objects.bulk_create(
        Job(
            **{
                **fields,
                "name": f"case-{i}",
                "state": c.state,
                "token": TOKEN,
                "lease_expires_at": lease_at(c.lease, now),
                "unstarted_dispatches": c.unstarted,
                "claimed_by": "beat-1",
                "overlap": c.overlap,
                "fixed_delay": c.fixed_delay,
                "dst_policy": c.dst_policy,
                "calendar_id": calendar.pk if c.calendar else None,
                "skip_late": DEADLINES[c.deadline][0],
                "start_deadline": DEADLINES[c.deadline][1],
            }
        )
        for i, c in enumerate(cases)
    )
    JobRun.objects.bulk_create(
        JobRun(
            job_id=job.pk,
            token=c.token,
            scheduled_for=now - DEADLINES[c.deadline][2]  # type: ignore[operator]
            if DEADLINES[c.deadline][2] is not None
            else fields["scheduled_for"]
            if c.same_schedule
            else fields["scheduled_for"] - timedelta(seconds=60),
            attempt=c.attempt,
            kind=c.kind,
            due_at=fields["next_run_at"],
            claimed_by="beat-1",
            dispatched_at=now - timedelta(seconds=10),
            task_id=task_id_for(job.pk, c.token),
            status=c.run,
            admission="a1",
            worker=OLD_WORKER,
            started_at=now - timedelta(seconds=5) if c.started else None,
            stale=c.stale,
            own_lease=c.own,
            lease_expires_at=lease_at(c.run_lease, now),
        )
        for job, c in zip(jobs, cases, strict=True)
        if c.run is not None
    )
    return [job.pk for job in jobs]


JOB_COLUMNS = ("state", "token", "lease_expires_at", "unstarted_dispatches", "claimed_by")
RUN_COLUMNS = (
    "status",
    "started_at",
    "finished_at",
    "worker",
    "admission",
    "error",
    "stale",
    "heartbeats",
    "heartbeat_at",
    "lease_expires_at",
    "scheduled_for",
    "attempt",
    "kind",
)


def rows(ids: list[int]) -> dict[int, tuple[dict, dict | None]]:
    jobs = {j["id"]: j for j in Job.objects.filter(id__in=ids).values("id", *JOB_COLUMNS)}
    late = set(
        Occurrence.objects.filter(job_id__in=ids, fate="late").values_list("job_id", flat=True)
    )
    for job_id, job in jobs.items():
        job["late_recorded"] = job_id in late
    runs = {
        r["job_id"]: r for r in JobRun.objects.filter(job_id__in=ids).values("job_id", *RUN_COLUMNS)
    }
    return {i: (jobs[i], runs.get(i)) for i in ids}


def facts(case: Case, now: datetime) -> tuple[rules.LeaseJob, rules.LeaseRun | None]:
    job = rules.LeaseJob(case.state, TOKEN, lease_at(case.lease, now), LEASE, case.unstarted)
    run = None if case.run is None else rules.LeaseRun(case.run, "a1", case.stale, case.started)
    return job, run


def sweep(
    cases: list[Case],
    now: datetime,
    call: Callable[[list[int]], list[Any]],
    expect: Callable[[Case, dict, dict | None], tuple[Any, dict, dict | None]],
    known: dict[Case, str],
) -> list[str]:
    """Every case through ``call`` in a savepoint: the disagreements with ``expect``, named."""
    ids = build(cases, now)
    before = rows(ids)

    class Undo(Exception):
        pass

    found: list[Any] = []
    try:
        with transaction.atomic():
            found.extend(call(ids))
            after = rows(ids)
            raise Undo
    except Undo:
        pass
    problems = []
    for job_id, case, got in zip(ids, cases, found, strict=True):
        if case in known:
            continue
        verdict, job_row, run_row = expect(case, *before[job_id])
        said = (got, *after[job_id])
        wanted = (verdict, job_row, run_row)
        if said != wanted:
            diff = [f"verdict {got!r} != {verdict!r}"] if got != verdict else []
            for label, have, want in (("job", said[1], job_row), ("run", said[2], run_row)):
                for key in want or {}:
                    if (have or {}).get(key) != want[key]:
                        diff.append(f"{label}.{key} {(have or {}).get(key)!r} != {want[key]!r}")
            problems.append(f"{case}: {'; '.join(diff)}")
    return problems


def report(problems: list[str], total: int) -> str:
    return f"{len(problems)} of {total} cases disagree with the table:\n" + "\n".join(problems[:40])


def attempt(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # a crash is a disagreement to name, not the end of the sweep
        return f"raised {type(exc).__name__}"


# --- the door ---------------------------------------------------------------------------------


def admission_of(case: Case) -> str:
    return "a1" if case.same_admission else "b2"


def own_run(case: Case, now: datetime) -> rules.RunLease:
    return rules.RunLease(
        case.run or "", lease_at(case.run_lease, now), "a1", case.stale, case.started
    )


def expect_door(
    now: datetime,
) -> Callable[[Case, dict, dict | None], tuple[Any, dict, dict | None]]:
    def expect(case: Case, job: dict, run: dict | None) -> tuple[Any, dict, dict | None]:
        if case.own:
            return expect_own_door(case, job, run, now)
        lease_job, lease_run = facts(case, now)
        skip_late, start_deadline, _ago = DEADLINES[case.deadline]
        lease_job = replace(lease_job, skip_late=skip_late, start_deadline=start_deadline)
        if lease_run is not None and run is not None:
            lease_run = replace(
                lease_run,
                scheduled_for=run["scheduled_for"],
                attempt=run["attempt"],
                kind=run["kind"],
            )
        decision = rules.door(lease_job, lease_run, case.token, admission_of(case), now)
        job, run = dict(job), None if run is None else dict(run)
        if decision.start_run:
            assert run is not None
            run.update(status="running", worker=WORKER, admission=admission_of(case))
            run["started_at"] = run["started_at"] or now
        if decision.fresh_lease:
            job.update(lease_expires_at=now + timedelta(seconds=LEASE), unstarted_dispatches=0)
        if decision.skip_run:
            assert run is not None
            run.update(
                status="skipped",
                finished_at=now,
                worker=WORKER,
                error=rules.skipped_error(decision.verdict),
            )
        if decision.release_lease:
            job.update(claimed_by="", lease_expires_at=None)
        if decision.hand_back:
            job.update(
                state="scheduled", claimed_by="", lease_expires_at=None, unstarted_dispatches=0
            )
        if decision.record_late:
            job["late_recorded"] = True
        return decision.verdict, job, run

    return expect


def expect_own_door(
    case: Case, job: dict, run: dict | None, now: datetime
) -> tuple[Any, dict, dict | None]:
    assert run is not None
    skip_late, start_deadline, _ago = DEADLINES[case.deadline]
    facts_of_run = replace(
        own_run(case, now),
        scheduled_for=run["scheduled_for"],
        attempt=run["attempt"],
        kind=run["kind"],
    )
    decision = rules.run_door(
        case.state,
        facts_of_run,
        admission_of(case),
        LEASE,
        now,
        rules.StartDeadline(skip_late, start_deadline),
    )
    job = dict(job)
    if decision.record_late:
        job["late_recorded"] = True
    run = dict(run)
    if decision.start_run:
        run.update(status="running", worker=WORKER, admission=admission_of(case))
        run["started_at"] = run["started_at"] or now
    if decision.fresh_lease:
        run["lease_expires_at"] = now + timedelta(seconds=LEASE)
    if decision.skip_run:
        run.update(
            status="skipped",
            finished_at=now,
            worker=WORKER,
            error=rules.skipped_error(decision.verdict),
            lease_expires_at=None,
        )
    return decision.verdict, job, run


# --- the portable store's sample ---------------------------------------------------------------
#
# The portable store's functions take a few milliseconds a case (the ORM, a savepoint per
# door): its tables of thousands of cases took over 20 s of the default run. The default run
# sweeps a sample of each, chosen by a fixed rule (``stratified``), the full tables run under
# ``exhaustive`` (CI). The PostgreSQL tables, a PL/pgSQL call a case, stay whole.

CLASS_NOW = datetime(2026, 1, 1, tzinfo=UTC)  # the rules read only offsets from now


def door_class(case: Case) -> tuple[Any, ...]:
    """The row of the door's table that decides ``case``, and the decision (verdict and
    writes): the case's class in ``stratified``."""
    now = CLASS_NOW
    skip_late, start_deadline, ago = DEADLINES[case.deadline]
    scheduled_for = now - ago if ago is not None else now + timedelta(seconds=LEASE)
    admission = admission_of(case)
    if case.own:
        run_lease = replace(
            own_run(case, now), scheduled_for=scheduled_for, attempt=case.attempt, kind=case.kind
        )
        decision = rules.run_door(
            case.state,
            run_lease,
            admission,
            LEASE,
            now,
            rules.StartDeadline(skip_late, start_deadline),
        )
        row = next(
            w for w, holds, _ in rules.RUN_DOOR if holds(run_lease, case.state, admission, now)
        )
        return ("own", row, decision)
    job, run = facts(case, now)
    job = replace(job, skip_late=skip_late, start_deadline=start_deadline)
    if run is None:
        return ("no run", rules.door(job, run, case.token, admission, now))
    run = replace(run, scheduled_for=scheduled_for, attempt=case.attempt, kind=case.kind)
    call = rules.DoorCall(job, run, case.token, admission, now)
    row = next(w for w, holds, _ in rules.DOOR if holds(call))
    return (row, rules.door(job, run, case.token, admission, now))


def renewal_class(case: Case) -> tuple[Any, ...]:
    """A renewal's decision (outcome and writes), per kind of lease: its class."""
    if case.own:
        return ("own", rules.run_renewal(own_run(case, CLASS_NOW)))
    return ("job", rules.renewal(*facts(case, CLASS_NOW), case.token))


def stratified(cases: list[Case], class_of: Callable[[Case], Any]) -> list[Case]:
    """A sample of a table that still hits every class of case (the row of the table that
    decides and the writes it implies) with every value of every axis (the lease at each
    boundary, each state, status, kind...), and every pair of axis values somewhere: the
    cases, in the table's order, that add something the ones before them did not. The same
    sample on every run (no randomness), about an eighth of the table."""
    axes = [f.name for f in fields(Case)]
    seen: set[tuple[Any, ...]] = set()
    sample = []
    for case in cases:
        values = [(axis, getattr(case, axis)) for axis in axes]
        cls = class_of(case)
        adds = {(cls, value) for value in values} | set(itertools.combinations(values, 2))
        if not adds <= seen:
            sample.append(case)
            seen |= adds
    return sample


def sampled(cases: list[Case], class_of: Callable[[Case], Any]) -> list[Any]:
    """``cases`` as two parameters: the stratified sample (the default run) and the whole
    table (``exhaustive``)."""
    return [
        pytest.param(stratified(cases, class_of), id="sample"),
        pytest.param(cases, id="all", marks=pytest.mark.exhaustive),
    ]


# The worker's functions take the run's id (the message's header) with its job and token, and
# read the run by it; without it (NULL: an older worker's message) they find it by job and
# token first, then decide as with it. Each PostgreSQL sweep runs both ways: the door's by
# claim in the default run, the others' by claim with the long tail (``exhaustive``). A case
# without a run is called with an id no run has.
BY_KEY = pytest.mark.parametrize("keyed", [True, False], ids=["by run id", "by claim"])
BY_KEY_CLAIM_EXHAUSTIVE = pytest.mark.parametrize(
    "keyed",
    [True, pytest.param(False, marks=pytest.mark.exhaustive)],
    ids=["by run id", "by claim"],
)


def run_ids() -> Callable[[int, int], int]:
    """A run's id by its claim, as the message carries it (0 for a case without a run): the
    sweep's runs read in one query at the first call (the test's database holds only them;
    the calls change no run's id or claim)."""
    known: dict[tuple[int, int], int] = {}

    def run_id_of(job_id: int, token: int) -> int:
        if not known:
            rows = JobRun.objects.values_list("job_id", "token", "id")
            known.update(((job, token), run) for job, token, run in rows)
        return known.get((job_id, token), 0)

    return run_id_of


def keyed_admit(admit: Callable[..., Any], keyed: bool) -> Callable[..., Any]:
    if not keyed:
        return admit
    run_id_of = run_ids()
    return lambda job_id, token, *rest: admit(job_id, token, *rest, run_id_of(job_id, token))


def keyed_renew(renew: Callable[..., Any], keyed: bool) -> Callable[..., Any]:
    if not keyed:
        return renew
    run_id_of = run_ids()
    return lambda held: renew(held, {(j, t): run_id_of(j, t) for j, t in held})


def door_sweep(store_admit: Callable[..., Any], cases: list[Case], now: datetime) -> list[str]:
    def call(ids: list[int]) -> list[Any]:
        return [
            attempt(store_admit, i, c.token, WORKER, admission_of(c))
            for i, c in zip(ids, cases, strict=True)
        ]

    return sweep(cases, now, call, expect_door(now), {})


@BY_KEY_CLAIM_EXHAUSTIVE
def test_the_postgresql_door_of_a_run_with_its_own_lease_decides_as_the_table(now, keyed):
    problems = door_sweep(keyed_admit(PostgreSQLStore().admit, keyed), OWN_DOOR_CASES, now)
    assert not problems, report(problems, len(OWN_DOOR_CASES))


@pytest.mark.parametrize("cases", sampled(OWN_DOOR_CASES, door_class))
def test_the_portable_door_of_a_run_with_its_own_lease_decides_as_the_table(now, cases):
    def admit(*args: Any) -> Any:
        return portable._admit("default", now, *args)

    problems = door_sweep(admit, cases, now)
    assert not problems, report(problems, len(cases))


@BY_KEY
def test_the_postgresql_door_decides_as_the_table(now, keyed):
    admit = keyed_admit(PostgreSQLStore().admit, keyed)

    def call(ids: list[int]) -> list[Any]:
        return [
            attempt(admit, i, c.token, WORKER, admission_of(c))
            for i, c in zip(ids, DOOR_CASES, strict=True)
        ]

    problems = sweep(DOOR_CASES, now, call, expect_door(now), {})
    assert not problems, report(problems, len(DOOR_CASES))


@pytest.mark.parametrize("cases", sampled(DOOR_CASES, door_class))
def test_the_portable_door_decides_as_the_table(now, cases):
    def call(ids: list[int]) -> list[Any]:
        return [
            attempt(portable._admit, "default", now, i, c.token, WORKER, admission_of(c))
            for i, c in zip(ids, cases, strict=True)
        ]

    problems = sweep(cases, now, call, expect_door(now), {})
    assert not problems, report(problems, len(cases))


@BY_KEY_CLAIM_EXHAUSTIVE
def test_the_postgresql_door_refuses_a_late_run_as_the_table(now, keyed):
    problems = door_sweep(keyed_admit(PostgreSQLStore().admit, keyed), LATE_DOOR_CASES, now)
    assert not problems, report(problems, len(LATE_DOOR_CASES))


@pytest.mark.parametrize("cases", sampled(LATE_DOOR_CASES, door_class))
def test_the_portable_door_refuses_a_late_run_as_the_table(now, cases):
    def admit(*args: Any) -> Any:
        return portable._admit("default", now, *args)

    problems = door_sweep(admit, cases, now)
    assert not problems, report(problems, len(cases))


@BY_KEY_CLAIM_EXHAUSTIVE
def test_the_postgresql_door_of_a_run_with_its_own_lease_refuses_a_late_run_as_the_table(
    now, keyed
):
    admit = keyed_admit(PostgreSQLStore().admit, keyed)
    problems = door_sweep(admit, OWN_LATE_DOOR_CASES, now)
    assert not problems, report(problems, len(OWN_LATE_DOOR_CASES))


@pytest.mark.parametrize("cases", sampled(OWN_LATE_DOOR_CASES, door_class))
def test_the_portable_door_of_a_run_with_its_own_lease_refuses_a_late_run_as_the_table(now, cases):
    def admit(*args: Any) -> Any:
        return portable._admit("default", now, *args)

    problems = door_sweep(admit, cases, now)
    assert not problems, report(problems, len(cases))


# --- renewal ----------------------------------------------------------------------------------


def expect_renewal(
    now: datetime,
) -> Callable[[Case, dict, dict | None], tuple[Any, dict, dict | None]]:
    def expect(case: Case, job: dict, run: dict | None) -> tuple[Any, dict, dict | None]:
        lease_job, lease_run = facts(case, now)
        if case.own:
            decision = rules.run_renewal(own_run(case, now))
        else:
            decision = rules.renewal(lease_job, lease_run, case.token)
        job, run = dict(job), None if run is None else dict(run)
        if decision.extend_lease and case.own:
            assert run is not None
            run["lease_expires_at"] = now + timedelta(seconds=LEASE)
        elif decision.extend_lease:
            job["lease_expires_at"] = now + timedelta(seconds=LEASE)
        if decision.heartbeat:
            assert run is not None
            run.update(heartbeats=run["heartbeats"] + 1, heartbeat_at=now)
        return decision.outcome, job, run

    return expect


def renew_all(
    renew: Callable[[list[tuple[int, int]]], list[tuple[int, int, str]]],
    cases: list[Case] | None = None,
) -> Callable:
    """All the cases' leases in one heartbeat, as a worker holds many; outcomes in case order."""

    def call(ids: list[int]) -> list[Any]:
        held = [(i, c.token) for i, c in zip(ids, cases or RENEW_CASES, strict=True)]
        outcomes = {(j, t): outcome for j, t, outcome in renew(held)}
        return [outcomes.get(key, "missing") for key in held]

    return call


@BY_KEY_CLAIM_EXHAUSTIVE
def test_the_postgresql_renewal_decides_as_the_table(now, keyed):
    call = renew_all(keyed_renew(PostgreSQLStore().renew, keyed))
    problems = sweep(RENEW_CASES, now, call, expect_renewal(now), {})
    assert not problems, report(problems, len(RENEW_CASES))


def test_the_portable_renewal_decides_as_the_table(now):
    call = renew_all(lambda held: portable._renew("default", now, held))
    problems = sweep(RENEW_CASES, now, call, expect_renewal(now), {})
    assert not problems, report(problems, len(RENEW_CASES))


# Both kinds of lease in one heartbeat: a worker holding runs of allow_all jobs and of others.
MIXED_RENEW_CASES = OWN_RENEW_CASES + RENEW_CASES


@BY_KEY_CLAIM_EXHAUSTIVE
def test_the_postgresql_renewal_of_runs_with_their_own_lease_decides_as_the_table(now, keyed):
    call = renew_all(keyed_renew(PostgreSQLStore().renew, keyed), MIXED_RENEW_CASES)
    problems = sweep(MIXED_RENEW_CASES, now, call, expect_renewal(now), {})
    assert not problems, report(problems, len(MIXED_RENEW_CASES))


@pytest.mark.parametrize("cases", sampled(MIXED_RENEW_CASES, renewal_class))
def test_the_portable_renewal_of_runs_with_their_own_lease_decides_as_the_table(now, cases):
    call = renew_all(lambda held: portable._renew("default", now, held), cases)
    problems = sweep(cases, now, call, expect_renewal(now), {})
    assert not problems, report(problems, len(cases))


# --- completions ------------------------------------------------------------------------------


def all_success_args(ids: list[int], cases: list[Case], keyed: bool = True) -> list[list[Any]]:
    """``success_args`` of each case, its jobs and runs read in two queries."""
    jobs = Job.objects.in_bulk(ids)
    run_id_of = run_ids()
    return [
        success_args(jobs[i], c, run_id_of(i, c.token) if keyed else None)
        for i, c in zip(ids, cases, strict=True)
    ]


def success_args(job: Job, case: Case, run_id: int | None) -> list[Any]:
    """``schedapp_succeed_run``'s arguments for a success of the interval job ``build`` made,
    as the claim saw it (or, in a case without the same schedule, an occurrence earlier), with
    the run's id as a worker sends it, or NULL."""
    seen = job.scheduled_for if case.same_schedule else job.scheduled_for - timedelta(seconds=60)
    # An occurrence in the past came due during the run (the template's is a minute ahead).
    nxt = db_now() - timedelta(seconds=1) if case.next_passed else seen + job.interval
    return [job.pk, case.token, seen, nxt, False, "", "", job.interval, job.interval_anchor, run_id]


class Since:
    """Equal to a time at or after ``now``: Django's ``Now()`` on PostgreSQL is the
    statement's time, not the transaction's."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __eq__(self, other: object) -> bool:
        return isinstance(other, datetime) and other >= self.now

    def __repr__(self) -> str:
        return f"at or after {self.now}"


def moved_on(job: dict, *, now: datetime) -> dict:
    """The job columns a success that moved the job on leaves."""
    return {
        **job,
        "state": "paused" if job["state"] == "paused" else "scheduled",
        "claimed_by": "",
        "lease_expires_at": None,
    }


def expect_success(now: datetime, fast: bool) -> Callable:
    def expect(case: Case, job: dict, run: dict | None) -> tuple[Any, dict, dict | None]:
        lease_job, _ = facts(case, now)
        accepted = rules.completion(lease_job, case.run, case.token, rules.STARTED)
        if fast:
            applies = rules.fast_success(
                lease_job,
                case.run,
                case.token,
                # a DST policy the worker's computation did not assume: not the same schedule
                same_schedule=case.same_schedule and case.dst_policy == "gap_end+first",
                end_decides=end_decides(
                    case.overlap, case.fixed_delay, case.next_passed, case.calendar
                ),
            )
            accepted = rules.Completion.APPLIED if applies else None
        job, run = dict(job), None if run is None else dict(run)
        if accepted in (rules.Completion.APPLIED, rules.Completion.STALE):
            assert run is not None
            run.update(status="succeeded", finished_at=now if fast else Since(now), error="")
            run["stale"] = accepted is rules.Completion.STALE
        if accepted is rules.Completion.APPLIED:
            job = moved_on(job, now=now)
        return (applies if fast else accepted), job, run

    return expect


@BY_KEY_CLAIM_EXHAUSTIVE
def test_the_postgresql_success_applies_as_the_table(now, keyed):
    store = PostgreSQLStore()

    def call(ids: list[int]) -> list[Any]:
        return [attempt(store.succeed_run, a) for a in all_success_args(ids, SUCCESS_CASES, keyed)]

    problems = sweep(SUCCESS_CASES, now, call, expect_success(now, fast=True), {})
    assert not problems, report(problems, len(SUCCESS_CASES))


def test_the_postgresql_success_leaves_what_the_end_of_a_run_decides(now):
    """Overlap policies and fixed delay: the one call declines exactly what
    ``end_decides`` leaves to ``policies.plan_after_success``."""
    store = PostgreSQLStore()

    def call(ids: list[int]) -> list[Any]:
        return [attempt(store.succeed_run, a) for a in all_success_args(ids, END_CASES)]

    problems = sweep(END_CASES, now, call, expect_success(now, fast=True), {})
    assert not problems, report(problems, len(END_CASES))
    declined = [
        c for c in END_CASES if end_decides(c.overlap, c.fixed_delay, c.next_passed, c.calendar)
    ]
    assert 0 < len(declined) < len(END_CASES)
    # a calendar job, and an allow_all one, are declined whatever else holds
    assert all(c in declined for c in END_CASES if c.calendar or c.overlap == ALLOW_ALL)


def test_the_general_completion_accepts_as_the_table(now):
    def call(ids: list[int]) -> list[Any]:
        return [
            attempt(lambda i=i, t=c.token: complete_run(i, t, "succeeded").completion)
            for i, c in zip(ids, SUCCESS_CASES, strict=True)
        ]

    problems = sweep(SUCCESS_CASES, now, call, expect_success(now, fast=False), {})
    assert not problems, report(problems, len(SUCCESS_CASES))
