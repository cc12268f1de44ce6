"""The chaos run's oracle: pure functions over the histories a run leaves behind.

Two histories, on one clock (every process of a run lives on one host, and times read from
the database are converted to this host's clock by the harness before they get here):

* the **executions** the task itself recorded (``project.models.Execution``: which claim of
  which occurrence ran, on which worker node, when it started), not schedapp's run rows;
* the **faults** the harness injected (kind, the node hit, start and end).

A *duplicate* is a second execution of one occurrence. Each must be blamed on a fault that
could have caused it, or the run fails: "its earlier run was marked lost" explains every bug
away (DESIGN lesson 21). A second execution needs the earlier claim's lease to have been lost,
and a lease is lost only if the worker holding it stopped renewing it for a whole lease:

* the fault hit the node that ran the **older** claim (the lease that was lost), or that
  node's database link, or every node's ("*");
* it is of a kind that can stop renewals for a whole lease: the node killed, or frozen or cut
  off from the database for at least the job's lease. A broker outage, Celery's prefetch, a
  lost reply after a COMMIT, latency, a shorter freeze or partition, or anything done to a beat
  never explains a duplicate;
* it was under way in the window before the lease was found lost: the lease expired at some X
  with X - lease <= the fault's span's end and its start <= X, and the job was claimed again
  at ``anchor`` >= X, at most ``slack`` after X (the reaper's delay, the retry backoff). So the
  fault must overlap [anchor - lease - slack, anchor]. ``anchor`` is the first claim of the
  job after the older one (from the run rows' dispatch times: only a time, never a verdict),
  or the newer execution's start when no claim time is known. One thing defers the claim
  beyond the slack: beats claim nothing while the broker is down (a beat whose publish failed
  asks the broker before claiming again), so when the job was claimed again within ``slack``
  of a broker outage's end, X may lie anywhere from ``slack`` before that outage began, and
  the window opens one lease before that. Another defers it without bound: a lost run of an
  allow_all job is run again only when one of its ``max_concurrent`` slots frees, which runs
  on other killed or frozen workers may hold for leases more. So when the run rows say when
  the older run's lease was found lost (a reaper's time: only a time, never a verdict), that
  time is the anchor: the lease expired at most ``slack`` before it.

Two executions under the same claim (token) are never explained: the door admits a claim once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

# Faults that take a worker away outright, whatever their duration.
KILLS = frozenset({"kill_worker"})
# Faults that stop renewals only while they last: they explain a duplicate when they lasted
# at least the lease.
SPANS = frozenset({"freeze_worker", "partition_worker", "db_outage"})
# Faults during which no beat claims, so a lease that expires then is taken back only after.
DEFER_CLAIMS = frozenset({"broker_outage"})


@dataclass(frozen=True)
class Fault:
    kind: str  # kill_worker, freeze_worker, partition_worker, broker_outage, lost_reply, ...
    target: str  # the node hit ("worker3", "beat2"), or "*": every node
    start: float  # seconds since the epoch, the run's one clock
    end: float  # == start for an instant (a kill, a lost reply)
    detail: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Execution:
    job: int
    occurrence: Any  # the occurrence's scheduled time (anything hashable)
    token: int  # the claim it ran under
    node: str  # the worker node that ran it ("worker3")
    started: float
    lease: float  # the job's lease, seconds
    finished: float | None = None  # None: it never recorded its end (killed midway)


@dataclass(frozen=True)
class Duplicate:
    older: Execution  # the execution whose lease must have been lost
    newer: Execution
    anchor: float  # when the job was claimed again after ``older``'s claim
    fault: Fault | None  # the fault blamed; None: unexplained
    reason: str = ""

    @property
    def explained(self) -> bool:
        return self.fault is not None


@dataclass
class Verdict:
    executions: int = 0
    duplicates: list[Duplicate] = field(default_factory=list)
    lost: list[tuple[int, Any]] = field(default_factory=list)

    @property
    def attributed(self) -> int:
        return sum(d.explained for d in self.duplicates)

    @property
    def unexplained(self) -> list[Duplicate]:
        return [d for d in self.duplicates if not d.explained]

    @property
    def passed(self) -> bool:
        return not self.unexplained and not self.lost


def can_lose_lease(fault: Fault, lease: float) -> bool:
    """Whether ``fault`` can stop a worker renewing a lease of ``lease`` seconds long enough
    for it to expire."""
    if fault.kind in KILLS:
        return True
    return fault.kind in SPANS and fault.duration >= lease


def blame(
    older: Execution, anchor: float, faults: Sequence[Fault], slack: float
) -> tuple[Fault | None, str]:
    """The fault that explains why ``older``'s lease was lost before ``anchor`` (the earliest
    such), or None and why not."""
    window = (claim_window_start(anchor, older.lease, faults, slack), anchor)
    near = [f for f in faults if f.start <= window[1] and f.end >= window[0]]
    on_node = [f for f in near if f.target in (older.node, "*")]
    able = [f for f in on_node if can_lose_lease(f, older.lease)]
    if able:
        return min(able, key=lambda f: f.start), ""
    if on_node:
        kinds = ", ".join(sorted({f"{f.kind} ({f.duration:.1f}s)" for f in on_node}))
        lease = f"{older.lease:g}s"
        return None, f"only faults that cannot lose a {lease} lease hit {older.node}: {kinds}"
    if near:
        nodes = ", ".join(sorted({f"{f.kind} on {f.target}" for f in near}))
        return None, f"no fault hit {older.node} in the window; other nodes: {nodes}"
    return None, f"no fault at all in [{window[0]:.1f}, {window[1]:.1f}]"


def claim_window_start(anchor: float, lease: float, faults: Sequence[Fault], slack: float) -> float:
    """The earliest time a fault could have begun losing the lease taken back at ``anchor``:
    one lease and the slack before it, or, if that claim came within ``slack`` of the end of
    an outage that stops claims, one lease and the slack before that outage began."""
    start = anchor - lease - slack
    for f in faults:
        if f.kind in DEFER_CLAIMS and f.end <= anchor <= f.end + slack:
            start = min(start, f.start - lease - slack)
    return start


def first_claim_after(claims: Sequence[tuple[int, float]], token: int) -> float | None:
    """The time of the first claim of a job after its claim ``token`` (claims: (token, time))."""
    later = [at for t, at in claims if t > token]
    return min(later) if later else None


def find_duplicates(
    executions: Iterable[Execution],
    faults: Sequence[Fault],
    claims: Mapping[int, Sequence[tuple[int, float]]],
    slack: float,
    run_claims: Mapping[tuple[int, Any], Sequence[tuple[int, float]]] | None = None,
    lost_at: Mapping[tuple[int, int], float] | None = None,
) -> list[Duplicate]:
    """Every execution of an occurrence beyond its first, each blamed on a fault or not.

    The executions of one occurrence are ordered by claim: each one's predecessor is the
    claim whose lease had to be lost for it to run. ``run_claims`` holds, for the jobs whose
    runs each hold a lease of their own (allow_all), the claims per occurrence: the job is
    claimed again for its next occurrences while a run is in flight, so the claim that
    follows a lost lease is the next one of the same occurrence. ``lost_at`` holds, by (job,
    token), when a run's lease was found lost; the earlier of that and the next claim anchors
    the window."""
    by_occurrence: dict[tuple[int, Any], list[Execution]] = defaultdict(list)
    for e in executions:
        by_occurrence[(e.job, e.occurrence)].append(e)
    found = []
    for (job, _), group in sorted(by_occurrence.items(), key=lambda kv: str(kv[0])):
        group.sort(key=lambda e: (e.token, e.started))
        for older, newer in pairwise(group):
            if older.token == newer.token:
                found.append(
                    Duplicate(older, newer, newer.started, None, "one claim executed twice")
                )
                continue
            own = (run_claims or {}).get((job, older.occurrence))
            anchor = first_claim_after(own if own is not None else claims.get(job, ()), older.token)
            if anchor is None or anchor > newer.started:
                anchor = newer.started
            found_lost = (lost_at or {}).get((job, older.token))
            if found_lost is not None and found_lost < anchor:
                anchor = found_lost
            fault, reason = blame(older, anchor, faults, slack)
            found.append(Duplicate(older, newer, anchor, fault, reason))
    return found


def lost_occurrences(
    expected: Iterable[tuple[int, Any]], executions: Iterable[Execution]
) -> list[tuple[int, Any]]:
    """Occurrences that should have run and never started once."""
    ran = {(e.job, e.occurrence) for e in executions}
    return [key for key in expected if key not in ran]


def fate_problems(
    expected: Iterable[tuple[int, Any]],
    dispatched: Iterable[tuple[int, Any]],
    not_run: Iterable[tuple[int, Any, Any]],
    executions: Iterable[Execution],
    unstarted: Iterable[tuple[int, Any]] = (),
) -> list[str]:
    """The occurrence ledger checked against what happened: every expected occurrence has
    exactly one fate (dispatched: a run row; or not run: a record whose range holds it), one
    recorded as not run never executed, and one that executed was dispatched. ``not_run``
    holds (job, first, last) ranges; times compare as the caller gives them (one type).
    ``unstarted``: occurrences whose runs all ended without starting (refused at the door,
    message lost): deliveries, not a fate, when a record holds the occurrence (a resume or
    the misfire policy decided it after them), as ``schedapp.explain`` reads them."""
    ran = {(e.job, e.occurrence) for e in executions}
    sent = set(dispatched)
    undelivered = set(unstarted)
    ranges: dict[int, list[tuple[Any, Any]]] = defaultdict(list)
    for job, first, last in not_run:
        ranges[job].append((first, last))
    problems = []
    for job, at in expected:
        skipped = [r for r in ranges.get(job, ()) if r[0] <= at <= r[1]]
        has_run = (job, at) in sent and not (skipped and (job, at) in undelivered)
        fates = int(has_run) + len(skipped)
        if fates == 0:
            problems.append(f"job {job} occurrence {at}: no fate recorded")
        elif fates > 1:
            what = (["a run"] if has_run else []) + [
                f"not run [{first}, {last}]" for first, last in skipped
            ]
            problems.append(f"job {job} occurrence {at}: {fates} fates recorded: {what}")
        if skipped and (job, at) in ran:
            problems.append(f"job {job} occurrence {at}: recorded as not run, but it executed")
    problems += [
        f"job {job} occurrence {at}: executed with no run recorded"
        for job, at in sorted(ran - sent, key=str)
    ]
    return problems


def fate_counts(
    expected: Iterable[tuple[int, Any]],
    runs: Mapping[tuple[int, Any], Sequence[str]],
    not_run: Iterable[tuple[int, Any, Any, str]],
    executions: Iterable[Execution],
) -> dict[str, int]:
    """How many expected occurrences the check found under each fate: ``executed``, each
    not-run fate of the ledger (``overlapped``, ``paused``, ...), ``superseded`` (its last run
    cancelled before it started: cancel_other), ``dispatched, never executed`` (lost) and
    ``no fate``."""
    ran = {(e.job, e.occurrence) for e in executions}
    ranges: dict[int, list[tuple[Any, Any, str]]] = defaultdict(list)
    for job, first, last, fate in not_run:
        ranges[job].append((first, last, fate))
    counts: Counter = Counter()
    for job, at in expected:
        fates = [fate for first, last, fate in ranges.get(job, ()) if first <= at <= last]
        if (job, at) in ran:
            counts["executed"] += 1
        elif fates:
            counts[fates[0]] += 1
        elif superseded(runs.get((job, at), ())):
            counts["superseded"] += 1
        elif (job, at) in runs:
            counts["dispatched, never executed"] += 1  # lost
        else:
            counts["no fate"] += 1
    return dict(sorted(counts.items()))


def superseded(statuses: Sequence[str]) -> bool:
    """Whether an occurrence's last run was cancelled (cancel_other revoked it before it
    started, or a cancel closed it) or ``superseded`` (the harness's name for a run the
    reaper closed because a later occurrence superseded it before it started): its fate is
    that run's, which need not have executed. Neither is ever sent again, so one of them
    among an occurrence's runs is its last (earlier ones were lost or refused unstarted)."""
    return any(s in ("cancelled", "superseded") for s in statuses)


def must_execute(
    expected: Iterable[tuple[int, Any]],
    runs: Mapping[tuple[int, Any], Sequence[str]],
    not_run: Iterable[tuple[int, Any, Any, str]],
) -> list[tuple[int, Any]]:
    """The expected occurrences that had to execute: all but those the ledger records as not
    run and those whose runs were all cancelled. One with no fate at all stays: never having
    executed, it is lost as well as unrecorded."""
    ranges: dict[int, list[tuple[Any, Any]]] = defaultdict(list)
    for job, first, last, _ in not_run:
        ranges[job].append((first, last))
    return [
        (job, at)
        for job, at in expected
        if not any(first <= at <= last for first, last in ranges.get(job, ()))
        and not superseded(runs.get((job, at), ()))
    ]


def overcommitted(
    executions: Iterable[Execution],
    limit: int,
    faults: Sequence[Fault],
    lost_tokens: Iterable[int],
) -> list[str]:
    """Instants at which more than ``limit`` executions of one allow_all job were executing
    at once, not counting those whose run lost its lease to a fault that could lose it (a
    frozen worker's run goes on when it thaws while a new one has taken its slot).
    ``lost_tokens``: the job's runs recorded lost or stale. An execution that never
    recorded its end ran until its worker was killed (or, with no such kill, to the end of
    the run: then it counts throughout)."""
    lost = set(lost_tokens)
    spans = []
    for e in executions:
        end = e.finished
        if end is None:
            kills = [f.start for f in faults if f.kind in KILLS and f.target == e.node]
            end = min((k for k in kills if k >= e.started), default=float("inf"))
        excused = e.token in lost and any(
            f.target in (e.node, "*")
            and can_lose_lease(f, e.lease)
            and f.start <= end
            and f.end >= e.started - e.lease
            for f in faults
        )
        if not excused:
            spans.append((e.started, end, e))
    events = sorted([(s, 1, e) for s, _, e in spans] + [(t, -1, e) for _, t, e in spans],
                    key=lambda x: (x[0], x[1]))
    problems, running = [], 0
    for at, step, e in events:
        running += step
        if step > 0 and running > limit:
            problems.append(
                f"job {e.job}: {running} executions at once (max_concurrent {limit}) when "
                f"token {e.token} started on {e.node} at {at:.1f}"
            )
    return problems


def judge(
    executions: Sequence[Execution],
    faults: Sequence[Fault],
    claims: Mapping[int, Sequence[tuple[int, float]]],
    expected: Iterable[tuple[int, Any]],
    slack: float,
    run_claims: Mapping[tuple[int, Any], Sequence[tuple[int, float]]] | None = None,
    lost_at: Mapping[tuple[int, int], float] | None = None,
) -> Verdict:
    """The whole verdict of one run: duplicates (blamed or not) and lost occurrences."""
    return Verdict(
        executions=len(executions),
        duplicates=find_duplicates(executions, faults, claims, slack, run_claims, lost_at),
        lost=lost_occurrences(expected, executions),
    )


def summary(verdict: Verdict, faults: Sequence[Fault]) -> dict[str, Any]:
    """The figures of one run, for the results file and the table."""
    return {
        "executions": verdict.executions,
        "duplicates": len(verdict.duplicates),
        "attributed": verdict.attributed,
        "unexplained": len(verdict.unexplained),
        "lost": len(verdict.lost),
        "blamed_on": dict(Counter(d.fault.kind for d in verdict.duplicates if d.fault)),
        "faults": dict(sorted(Counter(f.kind for f in faults).items())),
        "passed": verdict.passed,
    }


def describe(d: Duplicate, t0: float = 0.0) -> str:
    """One line per duplicate: what ran twice, and the fault blamed or why none could be."""
    head = (
        f"job {d.newer.job} occurrence {d.newer.occurrence}: token {d.older.token} on "
        f"{d.older.node} (started {d.older.started - t0:.1f}s), token {d.newer.token} on "
        f"{d.newer.node} (started {d.newer.started - t0:.1f}s, claimed {d.anchor - t0:.1f}s)"
    )
    if d.fault is None:
        return f"{head}: UNEXPLAINED: {d.reason}"
    f = d.fault
    return f"{head}: {f.kind} of {f.target} at {f.start - t0:.1f}s for {f.duration:.1f}s"


def counts_as_attempt(status: str, stale: bool, started: bool) -> bool:
    """Whether a run row is one of its job's attempts, as schedapp counts them toward
    ``max_retries``: a failed run (also one that never started: its task was unknown on the
    worker); a lost run that had started (the reaper counts it; one that never started is
    only sent again); and a stale run that had started: it lost its lease, the reaper counted
    it as lost, and its own completion, arriving later, recorded what the task did over the
    ``lost``, flagged stale and not counted again."""
    if stale:
        return started
    return status == "failed" or (status == "lost" and started)
