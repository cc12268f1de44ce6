"""The chaos oracle on synthetic histories: every duplicate is blamed on a fault that could
cause it (the node that held the lost lease, a fault able to lose a lease, in the window before
the job was claimed again), or the run fails."""

from __future__ import annotations

import pytest

from bench.chaos_oracle import (
    Execution,
    Fault,
    blame,
    can_lose_lease,
    counts_as_attempt,
    fate_counts,
    fate_problems,
    find_duplicates,
    judge,
    lost_occurrences,
    must_execute,
    overcommitted,
    summary,
)

LEASE = 8.0
SLACK = 10.0


def execution(token: int, node: str, started: float, job: int = 1, occurrence: str = "t0"):
    return Execution(job, occurrence, token, node, started, LEASE)


def pair(anchor: float = 100.0, old_node: str = "worker1", new_node: str = "worker2"):
    """Claim 1 ran on ``old_node`` at 80 s; claim 2 was made at ``anchor`` and ran at +1 s."""
    executions = [execution(1, old_node, 80.0), execution(2, new_node, anchor + 1.0)]
    claims = {1: [(1, 79.0), (2, anchor)]}
    return executions, claims


def kill(node: str, at: float) -> Fault:
    return Fault("kill_worker", node, at, at)


def test_a_duplicate_after_the_older_claims_worker_was_killed_is_attributed_to_the_kill():
    executions, claims = pair()
    (dup,) = find_duplicates(executions, [kill("worker1", 90.0)], claims, SLACK)
    assert dup.explained
    assert dup.fault == kill("worker1", 90.0)
    assert (dup.older.token, dup.newer.token, dup.anchor) == (1, 2, 100.0)


def test_a_duplicate_with_no_fault_at_all_is_unexplained():
    executions, claims = pair()
    verdict = judge(executions, [], claims, expected=[(1, "t0")], slack=SLACK)
    assert not verdict.passed
    assert (len(verdict.duplicates), verdict.attributed, len(verdict.unexplained)) == (1, 0, 1)
    assert "no fault at all" in verdict.unexplained[0].reason


def test_a_kill_of_another_worker_does_not_explain_it():
    executions, claims = pair()
    (dup,) = find_duplicates(executions, [kill("worker2", 90.0)], claims, SLACK)
    assert not dup.explained
    assert "no fault hit worker1" in dup.reason


def test_the_newer_claims_worker_being_hit_does_not_explain_it():
    # The lease that had to be lost is the older claim's: blaming the node that ran the
    # second copy would explain away a reaper that takes back live leases.
    executions, claims = pair(old_node="worker1", new_node="worker2")
    faults = [Fault("freeze_worker", "worker2", 85.0, 99.0)]
    (dup,) = find_duplicates(executions, faults, claims, SLACK)
    assert not dup.explained


@pytest.mark.parametrize(
    ("at", "explained"),
    [
        (100.0 - LEASE - SLACK - 0.01, False),  # ended just before the window
        (100.0 - LEASE - SLACK + 0.01, True),  # just inside it
        (100.0, True),  # at the re-claim itself
        (100.01, False),  # after the re-claim: it cannot have caused it
    ],
)
def test_the_window_is_one_lease_plus_the_slack_before_the_job_was_claimed_again(at, explained):
    executions, claims = pair(anchor=100.0)
    (dup,) = find_duplicates(executions, [kill("worker1", at)], claims, SLACK)
    assert dup.explained is explained


def test_a_span_fault_counts_if_any_part_of_it_is_in_the_window():
    executions, claims = pair(anchor=100.0)
    # a long freeze that began well before the window and lasted into it
    faults = [Fault("freeze_worker", "worker1", 60.0, 100.0 - LEASE - SLACK + 1.0)]
    (dup,) = find_duplicates(executions, faults, claims, SLACK)
    assert dup.explained


@pytest.mark.parametrize(
    ("kind", "duration", "able"),
    [
        ("kill_worker", 0.0, True),
        ("freeze_worker", LEASE, True),
        ("freeze_worker", LEASE - 0.1, False),  # shorter than the lease
        ("partition_worker", 2 * LEASE, True),
        ("partition_worker", 1.0, False),
        ("db_outage", LEASE + 1, True),
        ("broker_outage", 10 * LEASE, False),  # never, however long
        ("prefetch", 10 * LEASE, False),
        ("lost_reply", 0.0, False),
        ("latency", 10 * LEASE, False),
        ("kill_beat", 0.0, False),
        ("freeze_beat", 10 * LEASE, False),
        ("stall_claim", 10 * LEASE, False),
    ],
)
def test_only_a_kill_or_a_freeze_or_partition_as_long_as_the_lease_can_lose_it(
    kind, duration, able
):
    fault = Fault(kind, "worker1", 90.0, 90.0 + duration)
    assert can_lose_lease(fault, LEASE) is able
    executions, claims = pair()
    (dup,) = find_duplicates(executions, [fault], claims, SLACK)
    assert dup.explained is able


def test_a_fault_on_every_node_hits_the_older_claims_worker_too():
    executions, claims = pair()
    faults = [Fault("db_outage", "*", 88.0, 88.0 + LEASE + 2)]
    (dup,) = find_duplicates(executions, faults, claims, SLACK)
    assert dup.explained


def test_a_broker_outage_during_the_window_is_named_but_does_not_explain():
    executions, claims = pair()
    faults = [Fault("broker_outage", "*", 85.0, 99.0), Fault("freeze_worker", "worker1", 90, 91)]
    (dup,) = find_duplicates(executions, faults, claims, SLACK)
    assert not dup.explained
    assert "broker_outage" in dup.reason and "freeze_worker" in dup.reason


def test_a_kill_whose_lease_ran_out_during_a_broker_outage_explains_the_claim_after_it():
    # Chaos seed 6, 2026-12-01 (lease 8 s, slack 12 s): long-16 started on worker21 at 569.7 s,
    # worker21 was killed at 574.8 s, Redis was down from 581.9 s to 596.0 s, and beats claim
    # nothing while the broker is down, so the job was claimed again at 596.0 s, 21.2 s after
    # the kill: more than a lease and the slack, and the kill was its cause all the same.
    lease, slack = 8.0, 12.0
    executions = [
        Execution(1, "t0", 1, "worker21", 569.7, lease),
        Execution(1, "t0", 3, "worker23", 601.9, lease),
    ]
    claims = {1: [(1, 569.0), (3, 596.0)]}
    outage = Fault("broker_outage", "*", 581.9, 596.0)
    (dup,) = find_duplicates(executions, [kill("worker21", 574.8), outage], claims, slack)
    assert dup.explained and dup.fault == kill("worker21", 574.8)
    # Without the outage, the same kill is too early for that claim.
    (dup,) = find_duplicates(executions, [kill("worker21", 574.8)], claims, slack)
    assert not dup.explained


@pytest.mark.parametrize(
    ("kill_at", "outage", "explained"),
    [
        # the window opens one lease and the slack before the outage began
        (81.9 - LEASE - SLACK + 0.01, (81.9, 96.0), True),
        (81.9 - LEASE - SLACK - 0.01, (81.9, 96.0), False),
        # the claim came more than the slack after the outage ended: it was not deferred by it
        (75.0, (50.0, 60.0), False),
        # the claim came during the outage: nothing was deferred
        (75.0, (90.0, 110.0), False),
    ],
)
def test_a_broker_outage_widens_the_window_only_for_a_claim_it_held_back(
    kill_at: float, outage: tuple[float, float], explained: bool
):
    executions = [execution(1, "worker1", 60.0), execution(2, "worker2", 101.0)]
    claims = {1: [(1, 59.0), (2, 100.0)]}
    faults = [kill("worker1", kill_at), Fault("broker_outage", "*", *outage)]
    (dup,) = find_duplicates(executions, faults, claims, SLACK)
    assert dup.explained is explained


def test_the_same_claim_executed_twice_is_never_explained():
    executions = [execution(1, "worker1", 80.0), execution(1, "worker2", 95.0)]
    (dup,) = find_duplicates(executions, [kill("worker1", 90.0)], {1: [(1, 79.0)]}, SLACK)
    assert not dup.explained
    assert dup.reason == "one claim executed twice"


def test_the_anchor_is_the_first_claim_after_the_older_one_not_the_executing_one():
    # Claim 2's message was lost (never executed); claim 3 ran. The lease lost is claim 1's,
    # and the job was claimed again at claim 2's time: the window ends there.
    executions = [execution(1, "worker1", 80.0), execution(3, "worker2", 140.0)]
    claims = {1: [(1, 79.0), (2, 100.0), (3, 130.0)]}
    (dup,) = find_duplicates(executions, [kill("worker1", 90.0)], claims, SLACK)
    assert (dup.anchor, dup.explained) == (100.0, True)
    # a kill after claim 2 cannot have lost claim 1's lease
    (dup,) = find_duplicates(executions, [kill("worker1", 110.0)], claims, SLACK)
    assert not dup.explained


def test_a_frozen_workers_buffered_copy_running_last_is_blamed_on_its_freeze():
    # worker1 held claim 1 in its prefetch buffer, was frozen past the lease; claim 2 ran on
    # worker2 during the freeze, and claim 1's copy ran when worker1 woke up: by start time
    # the frozen worker's copy is the second one, by claim it is the first.
    executions = [execution(1, "worker1", 121.0), execution(2, "worker2", 102.0)]
    claims = {1: [(1, 85.0), (2, 100.0)]}
    faults = [Fault("freeze_worker", "worker1", 90.0, 120.0)]
    (dup,) = find_duplicates(executions, faults, claims, SLACK)
    assert dup.explained and dup.older.node == "worker1"


def test_three_executions_are_two_duplicates_each_blamed_on_its_own_fault():
    executions = [
        execution(1, "worker1", 10.0),
        execution(2, "worker2", 40.0),
        execution(3, "worker3", 70.0),
    ]
    claims = {1: [(1, 9.0), (2, 30.0), (3, 60.0)]}
    verdict = judge(executions, [kill("worker1", 20.0)], claims, [(1, "t0")], SLACK)
    first, second = verdict.duplicates
    assert first.explained and not second.explained  # worker2 was never hit
    assert summary(verdict, [kill("worker1", 20.0)])["unexplained"] == 1


def test_an_occurrence_that_never_started_is_lost_and_fails_the_run():
    executions = [execution(1, "worker1", 10.0, occurrence="t0")]
    expected = [(1, "t0"), (1, "t1"), (2, "t0")]
    assert lost_occurrences(expected, executions) == [(1, "t1"), (2, "t0")]
    verdict = judge(executions, [], {}, expected, SLACK)
    assert not verdict.passed and verdict.duplicates == []


def test_blame_names_the_earliest_capable_fault():
    older = execution(1, "worker1", 80.0)
    faults = [kill("worker1", 95.0), Fault("partition_worker", "worker1", 85.0, 85.0 + LEASE)]
    fault, _ = blame(older, 100.0, faults, SLACK)
    assert fault is not None and fault.kind == "partition_worker"


def test_summary_counts_faults_per_kind_and_what_was_blamed():
    executions, claims = pair()
    faults = [kill("worker1", 90.0), Fault("broker_outage", "*", 20.0, 30.0)]
    figures = summary(judge(executions, faults, claims, [(1, "t0")], SLACK), faults)
    assert figures == {
        "executions": 2,
        "duplicates": 1,
        "attributed": 1,
        "unexplained": 0,
        "lost": 0,
        "blamed_on": {"kill_worker": 1},
        "faults": {"broker_outage": 1, "kill_worker": 1},
        "passed": True,
    }


def test_attempts_are_counted_as_schedapp_counts_them_toward_max_retries():
    # An always-failing job with max_retries=2, dead after three attempts: token 1 failed;
    # token 2 passed the door, its worker froze past the lease, the reaper counted it as lost,
    # and its own failure arrived afterwards, recorded stale over the "lost"; token 4 failed.
    # (Chaos seed 9, job fail-6: the check that skipped stale runs counted two.)
    history = [("failed", False, True), ("failed", True, True), ("failed", False, True)]
    assert sum(counts_as_attempt(*run) for run in history) == 3
    # A lost run counts only if it had started: one no worker started is only sent again,
    # and so is a batch released after a failed publish
    assert counts_as_attempt("lost", False, True)
    assert not counts_as_attempt("lost", False, False)
    # A failure counts even unstarted (its task was unknown on the worker); a success or a
    # copy refused at the door does not
    assert counts_as_attempt("failed", False, False)
    assert not counts_as_attempt("succeeded", False, True)
    assert not counts_as_attempt("skipped", False, False)
    # So a job dead-lettered after two real attempts and two unstarted re-sends is caught
    early = [("failed", False, True), ("lost", False, False), ("lost", False, False)]
    early.append(("failed", False, True))
    assert sum(counts_as_attempt(*run) for run in early) == 2


# --- the occurrence ledger against what happened --------------------------------------------


def test_every_occurrence_with_one_fate_and_consistent_executions_passes():
    expected = [(1, 10), (1, 20), (1, 30), (1, 40)]
    dispatched = [(1, 10), (1, 40)]
    not_run = [(1, 20, 30)]  # one range: 20 and 30
    runs = [
        execution(1, "worker1", 0.0, occurrence=10),
        execution(2, "worker1", 1.0, occurrence=40),
    ]
    assert fate_problems(expected, dispatched, not_run, runs) == []


@pytest.mark.parametrize(
    ("dispatched", "not_run", "executed", "problem"),
    [
        ([(1, 10)], [], [(1, 10)], "occurrence 20: no fate recorded"),
        ([(1, 10), (1, 20)], [(1, 20, 20)], [(1, 10)], "occurrence 20: 2 fates recorded"),
        ([(1, 10)], [(1, 20, 20)], [(1, 10), (1, 20)], "20: recorded as not run, but it executed"),
        ([(1, 10)], [(1, 20, 20)], [(1, 10), (1, 15)], "15: executed with no run recorded"),
    ],
)
def test_the_ledger_check_names_what_is_missing_doubled_or_contradicted(
    dispatched, not_run, executed, problem
):
    executions = [
        execution(i, "worker1", float(i), job=j, occurrence=at)
        for i, (j, at) in enumerate(executed)
    ]
    problems = fate_problems([(1, 10), (1, 20)], dispatched, not_run, executions)
    assert any(problem in p for p in problems), problems


def test_occurrences_recorded_not_run_or_superseded_need_not_execute_the_others_must():
    # 10 ran, 20-30 overlapped (one range), 40's only run was cancelled before it started
    # (cancel_other), 50 was dispatched and never executed, 60 has no fate at all.
    expected = [(1, t) for t in (10, 20, 30, 40, 50, 60)]
    runs = {(1, 10): ["succeeded"], (1, 40): ["cancelled"], (1, 50): ["lost", "succeeded"]}
    not_run = [(1, 20, 30, "overlapped")]
    executions = [execution(1, "worker1", 0.0, occurrence=10)]
    must = must_execute(expected, runs, not_run)
    assert must == [(1, 10), (1, 50), (1, 60)]
    assert lost_occurrences(must, executions) == [(1, 50), (1, 60)]
    assert fate_counts(expected, runs, not_run, executions) == {
        "dispatched, never executed": 1,
        "executed": 1,
        "no fate": 1,
        "overlapped": 2,
        "superseded": 1,
    }


def test_a_run_lost_unstarted_then_superseded_need_not_execute():
    # the reaper's closing of a superseded run that never started counts as cancelled
    assert must_execute([(1, 10)], {(1, 10): ["lost", "superseded"]}, []) == []
    assert must_execute([(1, 10)], {(1, 10): ["skipped"]}, []) == [(1, 10)]


def span(token: int, node: str, started: float, finished: float | None) -> Execution:
    return Execution(1, token, token, node, started, LEASE, finished)


def test_allow_all_within_max_concurrent_passes_and_one_more_at_once_is_named():
    three = [span(1, "worker1", 0, 10), span(2, "worker2", 1, 10), span(3, "worker1", 2, 10)]
    assert overcommitted(three, 3, [], []) == []
    assert overcommitted([*three, span(4, "worker2", 10, 12)], 3, [], []) == []  # one ended
    (problem,) = overcommitted([*three, span(4, "worker2", 9, 12)], 3, [], [])
    assert "4 executions at once (max_concurrent 3)" in problem
    assert "token 4" in problem


def test_a_run_whose_lease_a_long_freeze_lost_does_not_count_against_the_limit():
    # Token 1's worker froze for two leases: its run was reaped (lost) and token 3 took its
    # slot; when worker1 thawed, token 1 went on beside 2 and 3.
    runs = [span(1, "worker1", 0, 30), span(2, "worker2", 1, 30), span(3, "worker2", 20, 30)]
    freeze = Fault("freeze_worker", "worker1", 2.0, 2.0 + 2 * LEASE)
    assert overcommitted(runs, 2, [freeze], lost_tokens=[1]) == []
    # Not recorded as lost, or frozen for less than a lease: the third one is a violation.
    assert overcommitted(runs, 2, [freeze], lost_tokens=[]) != []
    short = Fault("freeze_worker", "worker1", 2.0, 2.0 + LEASE / 2)
    assert overcommitted(runs, 2, [short], lost_tokens=[1]) != []


def test_an_execution_killed_midway_ran_until_its_worker_was_killed():
    runs = [span(1, "worker1", 0, None), span(2, "worker2", 1, 30), span(3, "worker2", 20, 30)]
    assert overcommitted(runs, 2, [kill("worker1", 10.0)], []) == []
    # With no kill to end it, it counts to the end of the run.
    assert overcommitted(runs, 2, [], []) != []


def test_allow_all_blames_the_lost_lease_on_its_occurrences_next_claim_not_the_jobs():
    # An allow_all job is claimed every 2 s for its next occurrences: token 18 (another
    # occurrence) was claimed at 53.4 s, before worker1 froze for two leases at 54.2 s; the
    # lost run of occurrence "t0" (token 17) was claimed again as token 22 at 66 s.
    older = Execution(1, "t0", 17, "worker1", 50.5, LEASE)
    newer = Execution(1, "t0", 22, "worker1", 68.6, LEASE)
    claims = {1: [(17, 50.0), (18, 53.4), (22, 66.0)]}
    freeze = Fault("freeze_worker", "worker1", 54.2, 54.2 + 2 * LEASE)
    (by_job,) = find_duplicates([older, newer], [freeze], claims, SLACK)
    assert not by_job.explained  # the job's next claim came before the freeze
    run_claims = {(1, "t0"): [(17, 50.0), (22, 66.0)]}
    (by_run,) = find_duplicates([older, newer], [freeze], claims, SLACK, run_claims)
    assert by_run.anchor == 66.0
    assert by_run.fault == freeze


def test_dispatches_that_never_started_are_no_fate_beside_a_record_that_holds_them():
    # 10's run was lost before it started and the misfire policy then folded 10 and 20 into
    # 30: one fate each (the record); without the record, the lost run is 10's only fate.
    expected = [(1, 10), (1, 20), (1, 30)]
    executions = [execution(1, "worker1", 0.0, occurrence=30)]
    folded = [(1, 10, 20)]
    sent = [(1, 10), (1, 30)]
    assert fate_problems(expected, sent, folded, executions, unstarted=[(1, 10)]) == []
    (problem,) = fate_problems(expected, sent, folded, executions)
    assert "occurrence 10: 2 fates recorded: ['a run', 'not run [10, 20]']" in problem
    assert fate_problems([(1, 10)], sent, [], [], unstarted=[(1, 10)]) == []


def test_the_chaos_runs_lost_reply_faults_match_statements_the_workers_send():
    """A fault that matches no statement never fires, and the chaos run then passes without
    testing it (the door's fault named schedapp_admit_run_v4 after the workers moved to v5)."""
    from pathlib import Path

    import schedapp
    from bench.chaos import COMMIT, LOST_REPLIES

    sql = (Path(schedapp.__file__).parent / "sql" / "queries.sql").read_text()
    for name, fragment, _who in LOST_REPLIES:
        if fragment != COMMIT:
            assert fragment.decode() in sql, name


def test_a_lost_allow_all_run_waiting_for_a_slot_is_blamed_from_when_its_lease_was_found_lost():
    # Seed 1 of the 2026-12-05 run: token 61 started on worker12 at 201.6 s, worker12 was
    # killed at 201.8 s; the lease was found lost at 211 s, but the occurrence's retry waited
    # for one of max_concurrent's slots (held by runs on workers killed later) and was
    # claimed at 224.6 s, more than a lease and the slack after the kill.
    older = Execution(1, "t0", 61, "worker12", 201.6, LEASE)
    newer = Execution(1, "t0", 70, "worker14", 251.6, LEASE)
    claims = {1: [(61, 201.0), (70, 224.6)]}
    run_claims = {(1, "t0"): [(61, 201.0), (70, 224.6)]}
    killed = kill("worker12", 201.8)
    (by_claim,) = find_duplicates([older, newer], [killed], claims, SLACK, run_claims)
    assert not by_claim.explained
    lost_at = {(1, 61): 211.0}
    (by_loss,) = find_duplicates([older, newer], [killed], claims, SLACK, run_claims, lost_at)
    assert by_loss.anchor == 211.0
    assert by_loss.fault == killed
    # Still strict: a kill after the lease was found lost explains nothing.
    late = kill("worker12", 215.0)
    (after,) = find_duplicates([older, newer], [late], claims, SLACK, run_claims, lost_at)
    assert not after.explained
    # And a found-lost time later than the next claim does not move the anchor later.
    later = {(1, 61): 240.0}
    (first,) = find_duplicates([older, newer], [killed], claims, SLACK, run_claims, later)
    assert first.anchor == 224.6
