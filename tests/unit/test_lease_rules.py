"""The lease rules (``schedapp.lease.rules``) row by row, and properties over all their
inputs: in milliseconds, no database. ``tests/integration/test_lease_rules_sql.py`` holds the
PL/pgSQL and the portable store to the same table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedapp.lease import rules
from schedapp.lease.rules import Completion, LeaseJob, LeaseRun
from schedapp.store import DoorVerdict

NOW = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
LEASE = 60


def job(state: str = "running", *, token: int = 7, left: float | None = 40.0, unstarted: int = 0):
    expires = None if left is None else NOW + timedelta(seconds=left)
    return LeaseJob(state, token, expires, LEASE, unstarted)


def run(status: str = "dispatched", admission: str = "", *, stale=False, started=False):
    return LeaseRun(status, admission, stale, started)


# --- the door, row by row ---------------------------------------------------------------------

DOOR_ROWS = [
    # (why, job, run, message token, admission) -> verdict
    ("no job", None, run(), 7, "a", "unknown"),
    ("no run of this token", job(), None, 7, "a", "unknown"),
    ("claimed again since", job(token=8), run(), 7, "a", "stale_token"),
    ("stale even for its own retry", job(token=8), run("running", "a"), 7, "a", "stale_token"),
    ("its own retry", job(), run("running", "a"), 7, "a", "admitted"),
    ("its own retry, job paused since", job("paused"), run("running", "a"), 7, "a", "admitted"),
    ("its own retry, lease expired since", job(left=-1), run("running", "a"), 7, "a", "admitted"),
    ("paused", job("paused"), run(), 7, "a", "job_paused"),
    ("no longer running", job("dead", left=None), run(), 7, "a", "job_state"),
    ("another admission runs it", job(), run("running", "b"), 7, "a", "duplicate"),
    ("it already finished", job(), run("succeeded", "a"), 7, "a", "duplicate"),
    ("its lease ran out", job(left=-1), run(), 7, "a", "lease_expired"),
    ("its lease ends now", job(left=0), run(), 7, "a", "lease_expired"),
    ("its lease is just alive", job(left=1e-6), run(), 7, "a", "admitted"),
]


@pytest.mark.parametrize(
    ("why", "the_job", "the_run", "token", "admission", "verdict"),
    DOOR_ROWS,
    ids=[r[0] for r in DOOR_ROWS],
)
def test_the_door_table_row_by_row(why, the_job, the_run, token, admission, verdict):
    assert rules.door(the_job, the_run, token, admission, NOW).verdict == verdict, why


@pytest.mark.parametrize(
    ("left", "unstarted", "rewritten"),
    [
        (LEASE * 5 / 6 - 1e-6, 0, True),  # less than five sixths left: an ordinary lease
        (LEASE * 5 / 6, 0, False),  # five sixths left: the job row is not written
        (LEASE, 0, False),
        (LEASE + 1e-6, 0, True),  # a long dispatch wait is cut back to one lease
        (LEASE * 5 / 6, 1, True),  # a dispatch went unstarted: the count goes back to 0
        (None, 0, False),  # no lease (only a retried door gets here): none is given
        (None, 1, True),
    ],
)
def test_the_five_sixths_rule(left, unstarted, rewritten):
    assert rules.lease_needs_rewrite(job(left=left, unstarted=unstarted), NOW) is rewritten


def test_an_admitted_run_starts_and_a_refused_dispatched_one_is_skipped():
    admitted = rules.door(job(left=10), run(), 7, "a", NOW)
    assert (admitted.start_run, admitted.fresh_lease, admitted.skip_run) == (True, True, False)
    paused = rules.door(job("paused"), run(), 7, "a", NOW)
    assert (paused.skip_run, paused.release_lease, paused.start_run) == (True, True, False)
    expired = rules.door(job(left=-1), run(), 7, "a", NOW)
    assert (expired.skip_run, expired.release_lease) == (True, False)  # left to the reaper
    duplicate = rules.door(job(), run("running", "b"), 7, "a", NOW)
    assert duplicate == rules.DoorDecision("duplicate")  # writes nothing


def test_the_verdicts_are_the_door_verdicts():
    said = {r[-1] for r in DOOR_ROWS} | {row[2] for row in rules.DOOR}
    assert said == {v.value for v in DoorVerdict} - {"error"}  # error: the database unreachable


REPLACEMENT_ROWS = [
    ("takes over the carried run", job(), run("running", "c"), "admitted"),
    ("its own retry", job(), run("running", "own"), "admitted"),
    ("a paused job's run goes on", job("paused"), run("running", "c"), "admitted"),
    ("claimed again since", job(token=8), run("running", "c"), "stale_token"),
    ("no longer running", job("dead", left=None), run("running", "c"), "job_state"),
    ("the run is not running", job(), run("dispatched", "c"), "duplicate"),
    ("another admission runs it", job(), run("running", "x"), "duplicate"),
    ("its lease ran out", job(left=-1), run("running", "c"), "lease_expired"),
    ("no run", job(), None, "unknown"),
]


@pytest.mark.parametrize(
    ("why", "the_job", "the_run", "verdict"), REPLACEMENT_ROWS, ids=[r[0] for r in REPLACEMENT_ROWS]
)
def test_the_replacement_door_row_by_row(why, the_job, the_run, verdict):
    decision = rules.replacement_door(the_job, the_run, 7, "c", "own", NOW)
    assert (decision.verdict, decision.take_over) == (verdict, verdict == "admitted"), why
    assert not (decision.start_run or decision.fresh_lease or decision.skip_run)


# --- renewal ----------------------------------------------------------------------------------

RENEW_ROWS = [
    ("current lease", job(), run("running", started=True), True, "renewed"),
    ("a paused job's run goes on", job("paused"), run("running", started=True), True, "renewed"),
    ("held by another transaction", job(), run("running", started=True), False, "busy"),
    ("cancelled", job(token=8), run("cancelled", started=True), True, "cancelled"),
    ("finished", job("scheduled", token=8), run("succeeded", started=True), True, "finished"),
    ("finished, but stale", job(token=8), run("failed", stale=True, started=True), True, "lost"),
    ("never started", job(token=8), run("skipped"), True, "unstarted"),
    ("reaped while running", job(token=8), run("lost", started=True), True, "lost"),
    ("no run", job(token=8), None, True, "lost"),
    ("no lease", job("paused", left=None), run("running", started=True), True, "lost"),
    ("expired, not yet reaped", job(left=-5), run("running", started=True), True, "renewed"),
]


@pytest.mark.parametrize(
    ("why", "the_job", "the_run", "locked", "outcome"), RENEW_ROWS, ids=[r[0] for r in RENEW_ROWS]
)
def test_the_renewal_table_row_by_row(why, the_job, the_run, locked, outcome):
    decision = rules.renewal(the_job, the_run, 7, locked=locked)
    assert decision.outcome == outcome, why
    assert decision.extend_lease is (outcome == "renewed")
    assert decision.heartbeat is (outcome == "renewed" and the_run.status == "running")


# --- completions ------------------------------------------------------------------------------

COMPLETION_ROWS = [
    ("running, current", job(), "running", rules.STARTED, Completion.APPLIED),
    ("running, paused since", job("paused"), "running", rules.STARTED, Completion.APPLIED),
    ("reaped as lost", job(), "lost", rules.STARTED, Completion.STALE),
    ("claimed again since", job(token=8), "running", rules.STARTED, Completion.STALE),
    ("job gone", None, "running", rules.STARTED, Completion.STALE),
    ("job dead", job("dead", left=None), "running", rules.STARTED, Completion.STALE),
    ("a retry: already recorded", job(), "succeeded", rules.STARTED, Completion.ALREADY_RECORDED),
    ("no run", job(), None, rules.STARTED, Completion.ALREADY_RECORDED),
    ("never started", job(), "dispatched", rules.STARTED, Completion.ALREADY_RECORDED),
    ("an unstarted copy", job(), "dispatched", rules.UNSTARTED_ONLY, Completion.APPLIED),
    (
        "an unstarted copy, admitted",
        job(),
        "running",
        rules.UNSTARTED_ONLY,
        Completion.ALREADY_RECORDED,
    ),
    ("terminated as it started", job(), "dispatched", rules.ANY, Completion.APPLIED),
]


@pytest.mark.parametrize(
    ("why", "the_job", "status", "accepted", "verdict"),
    COMPLETION_ROWS,
    ids=[r[0] for r in COMPLETION_ROWS],
)
def test_the_completion_table_row_by_row(why, the_job, status, accepted, verdict):
    assert rules.completion(the_job, status, 7, accepted) is verdict, why


def test_the_one_call_success_takes_only_the_common_case():
    assert rules.fast_success(job(), "running", 7, same_schedule=True)
    assert not rules.fast_success(job(), "running", 7, same_schedule=False)
    assert not rules.fast_success(job(), "lost", 7, same_schedule=True)
    assert not rules.fast_success(job(token=8), "running", 7, same_schedule=True)


# --- properties over every input --------------------------------------------------------------

STATES = st.sampled_from(["scheduled", "running", "paused", "succeeded", "dead", "cancelled"])
STATUSES = st.sampled_from(
    ["dispatched", "running", "succeeded", "failed", "lost", "skipped", "cancelled"]
)
jobs = st.builds(
    LeaseJob,
    state=STATES,
    token=st.integers(0, 3),
    lease_expires_at=st.none() | st.integers(-90, 90).map(lambda s: NOW + timedelta(seconds=s)),
    lease_seconds=st.integers(1, 90),
    unstarted_dispatches=st.integers(0, 2),
)
runs = st.builds(
    LeaseRun,
    status=STATUSES,
    admission=st.sampled_from(["", "a", "b"]),
    stale=st.booleans(),
    started=st.booleans(),
)


@given(jobs, runs, st.integers(0, 3), st.sampled_from(["a", "b"]))
def test_a_door_never_admits_under_a_token_that_is_not_the_jobs(j, r, token, admission):
    decision = rules.door(j, r, token, admission, NOW)
    if token != j.token:
        assert decision.verdict == "stale_token"
        assert not (decision.start_run or decision.fresh_lease or decision.release_lease)


@given(jobs, runs, st.sampled_from(["a", "b"]))
def test_a_retried_door_is_admitted_again_iff_its_run_is_running(j, r, admission):
    retried = LeaseRun(r.status, admission, r.stale, r.started)  # the run this call admitted
    decision = rules.door(j, retried, j.token, admission, NOW)
    if retried.status == "running":
        assert decision.verdict == "admitted"
    else:
        # not a retry: admitted only as a first door call would be
        assert decision.verdict != "admitted" or retried.status == "dispatched"


@given(jobs, runs, st.integers(0, 3), st.sampled_from(["a", "b"]))
def test_an_admitted_run_starts_and_only_a_dispatched_run_is_skipped(j, r, token, admission):
    d = rules.door(j, r, token, admission, NOW)
    assert d.start_run is (d.verdict == "admitted")
    assert d.skip_run is (d.verdict != "admitted" and r.status == "dispatched")
    assert not (d.fresh_lease and d.release_lease)
    if d.verdict == "admitted" and r.status == "dispatched":  # a first admission
        assert j.lease_expires_at is not None and j.lease_expires_at > NOW


@given(jobs, st.one_of(st.none(), runs), st.integers(0, 3), st.booleans())
def test_a_renewal_extends_only_a_current_live_lease(j, r, token, locked):
    d = rules.renewal(j, r, token, locked=locked)
    assert d.extend_lease is (d.outcome == "renewed")
    if d.extend_lease:
        assert locked and token == j.token and j.state in ("running", "paused")
    assert (d.outcome == "busy") is (not locked and not d.extend_lease)


@given(st.one_of(st.none(), jobs), st.one_of(st.none(), STATUSES), st.integers(0, 3))
def test_a_completion_moves_the_job_only_from_its_current_running_run(j, status, token):
    for accepted in (rules.STARTED, rules.UNSTARTED_ONLY, rules.ANY):
        verdict = rules.completion(j, status, token, accepted)
        assert (verdict is Completion.ALREADY_RECORDED) is (status not in accepted)
        if verdict is Completion.APPLIED:
            assert j is not None and j.token == token and j.state in ("running", "paused")
            assert status != "lost"
