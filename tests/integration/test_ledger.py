"""The occurrence ledger: every occurrence that did not run is recorded with why, in the
transaction that decided it, and ``schedapp.explain`` answers "what happened at 08:00?"."""

from __future__ import annotations

import calendar
import io
import json
import time
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command

from schedapp import api, explain, lease, ledger
from schedapp.context import RunInfo
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobRun, JobState, Occurrence
from schedapp.policies import MissedRange
from schedapp.prune import prune_runs

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)


def job_missing(every: timedelta, count: int, name: str = "late", **options) -> Job:
    """A job every ``every`` that missed its last ``count`` occurrences, the latest half an
    ``every`` ago (an interval, so the test does not depend on the wall clock)."""
    latest = db_now() - every / 2
    job = api.schedule(
        "project.tasks.record", interval=every, interval_anchor=latest, name=name, **options
    )
    first = latest - (count - 1) * every
    Job.objects.filter(pk=job.pk).update(scheduled_for=first, next_run_at=first)
    return Job.objects.get(pk=job.pk)


def run_to_success(run: lease.ClaimedRun) -> None:
    assert admit_run(run.job_id, run.token, "w1", admission=f"w1-{run.token}") == "admitted"
    assert complete_run(run.job_id, run.token, lease.SUCCEEDED).applied


def test_a_job_found_past_its_expiry_ends_instead_of_failing_the_claim():
    """A job whose expires_at passed while no beat ran, under ``skip``: the plan has no next
    occurrence, and the claim asserted one, failing every claim of every beat, every tick."""
    job = job_missing(MINUTE, 30, misfire_policy="skip")
    Job.objects.filter(pk=job.pk).update(expires_at=db_now() - 10 * MINUTE)
    other = api.schedule("project.tasks.record", run_at=db_now() - MINUTE, name="other")
    # When a beat claims
    result = claim_due_jobs("beat-1", 10)
    # Then the other job is claimed, and the expired one is done, its missed ones recorded
    assert [r.job_id for r in result.runs] == [other.pk]
    job.refresh_from_db()
    assert (job.state, job.next_run_at) == (JobState.SUCCEEDED, None)
    [record] = Occurrence.objects.filter(job=job)
    assert record.fate == "misfired" and record.count == job.missed_runs > 0


def test_the_claim_records_the_occurrences_its_misfire_policy_did_not_run():
    job = job_missing(5 * MINUTE, 10, misfire_policy="run_once")
    first = job.scheduled_for
    # When a beat claims it, 10 occurrences late
    (run,) = claim_due_jobs("beat-1", 10).runs
    # Then the latest runs and the 9 before it are one record, with the reason
    assert run.scheduled_for == first + 9 * 5 * MINUTE
    [record] = Occurrence.objects.filter(job=job)
    assert (record.scheduled_for, record.last, record.count) == (first, first + 8 * 5 * MINUTE, 9)
    assert (record.fate, record.decided_by) == ("misfired", "beat-1")
    assert f"folded into {run.scheduled_for.isoformat()}" in record.detail
    # And explain says so for any of them, and that the latest ran
    answer = explain.explain(job, first + 3 * 5 * MINUTE)
    assert answer.nominal and answer.entry is not None and answer.entry.fate == "misfired"
    assert "did not run" in answer.text and "one of 9 occurrences" in answer.text
    run_to_success(run)
    ran = explain.explain(job, run.scheduled_for)
    assert ran.entry is not None and ran.entry.outcome == "succeeded"
    assert " ran: attempt 1 (token " in ran.text and ran.text.endswith(": succeeded.")
    # And nothing in between is unaccounted for
    assert explain.unaccounted(job, first, run.scheduled_for) == []


def test_run_all_beyond_its_bound_accounts_for_every_occurrence():
    job = job_missing(MINUTE, 12, misfire_policy="run_all", misfire_max_catchup=4)
    first = job.scheduled_for
    # When the beat catches up, one run after the other
    ran = []
    for _ in range(4):
        (run,) = claim_due_jobs("beat-1", 10).runs
        ran.append(run.scheduled_for)
        run_to_success(run)
    # Then the 4 latest ran, the 8 before are recorded, and each occurrence has one fate
    assert ran == [first + i * MINUTE for i in range(8, 12)]
    [record] = Occurrence.objects.filter(job=job)
    assert record.count == 8 and "misfire_max_catchup (4)" in record.detail
    assert explain.unaccounted(job, first, ran[-1]) == []
    fates = [e.fate for e in explain.timeline(job)]
    assert fates == ["ran"] * 4 + ["misfired"]


def last_weekday(year: int, month: int) -> date:
    day = date(year, month, calendar.monthrange(year, month)[1])
    while day.weekday() >= 5:  # walk back over Saturday and Sunday
        day -= timedelta(days=1)
    return day


def last_friday(year: int, month: int) -> date:
    day = date(year, month, calendar.monthrange(year, month)[1])
    while day.weekday() != 4:
        day -= timedelta(days=1)
    return day


@pytest.mark.parametrize(
    ("cron", "day"), [("0 9 LW * *", last_weekday), ("0 0 9 * * FRIL", last_friday)]
)
def test_a_cron_day_form_away_for_a_year_is_counted_and_recorded_exactly(cron, day):
    """The claim counts a job's missed occurrences by arithmetic (cronmath) and finds the
    latest by walking back: for LW and FRIL, the oracle's days at 09:00 in Paris."""
    zone = ZoneInfo("Europe/Paris")
    now = db_now()
    here = now.astimezone(zone)
    fires = []
    for back in range(13, -1, -1):
        index = here.year * 12 + here.month - 1 - back
        on = day(index // 12, index % 12 + 1)
        fire = datetime(on.year, on.month, on.day, 9, tzinfo=zone).astimezone(UTC)
        if fire <= now:
            fires.append(fire)
    fires = fires[-12:]  # a year of them, the latest one due
    job = api.schedule(
        "project.tasks.record", cron=cron, timezone="Europe/Paris", misfire_policy="run_once"
    )
    Job.objects.filter(pk=job.pk).update(scheduled_for=fires[0], next_run_at=fires[0])
    # When a beat claims it, 12 occurrences late
    (run,) = claim_due_jobs("beat-1", 10).runs
    # Then the latest runs, the 11 before it are one record, and none is unaccounted for
    assert run.scheduled_for == fires[-1]
    [record] = Occurrence.objects.filter(job=job)
    assert (record.scheduled_for, record.last, record.count) == (fires[0], fires[-2], 11)
    assert explain.unaccounted(job, fires[0], run.scheduled_for) == []
    run_to_success(run)
    job.refresh_from_db()
    assert job.missed_runs == 11
    nxt = job.next_run_at.astimezone(zone)
    assert nxt.date() == day(nxt.year, nxt.month) and (nxt.hour, nxt.minute) == (9, 0)


def test_the_same_decision_twice_keeps_the_first_record():
    job = job_missing(MINUTE, 3)
    at = job.scheduled_for
    ledger.record([(job.pk, MissedRange(at, at + MINUTE, 2, "misfired", "first"))], "beat-1")
    ledger.record([(job.pk, MissedRange(at, at, 1, "paused", "second"))], "beat-2")
    [record] = Occurrence.objects.filter(job=job)
    assert (record.detail, record.count) == ("first", 2)


def test_occurrences_that_passed_while_paused_are_recorded_as_paused_on_resume():
    job = job_missing(MINUTE, 10, misfire_policy="run_once")
    first = job.scheduled_for
    api.pause(job)
    # When it is resumed, ten occurrences later
    api.resume(job)
    # Then the nine older ones are recorded as passed while paused, the latest runs
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.count, record.decided_by) == ("paused", 9, "resume")
    assert record.detail.startswith("passed while the job was paused; folded into")
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert run.scheduled_for == first + 9 * MINUTE
    assert Occurrence.objects.filter(job=job).count() == 1  # the claim decided nothing more
    job.refresh_from_db()
    assert job.missed_runs == 9


def test_a_catch_up_window_records_what_is_older_and_runs_the_rest_by_policy():
    job = job_missing(MINUTE, 60, misfire_policy="run_all", misfire_max_catchup=100)
    Job.objects.filter(pk=job.pk).update(catchup_window=timedelta(minutes=10))
    first = job.scheduled_for
    (run,) = claim_due_jobs("beat-1", 10).runs
    # Then what is older than ten minutes is recorded as such, and the rest run from there
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.scheduled_for) == ("outside_window", first)
    assert run.scheduled_for == record.last + MINUTE
    assert record.count + 10 == 60  # the ten newest, 9.5 to 0.5 minutes old, still run


def test_cancelling_a_job_records_the_occurrence_it_was_waiting_for():
    job = api.schedule("project.tasks.record", cron="0 8 * * *", name="daily")
    at = job.scheduled_for
    api.cancel(job)
    answer = explain.explain(job, at)
    assert answer.entry is not None and answer.entry.fate == "cancelled"


def test_a_quarantined_job_records_the_occurrence_it_was_waiting_for():
    job = job_missing(MINUTE, 5)
    Job.objects.filter(pk=job.pk).update(interval=None, interval_anchor=None, cron="61 * * * *")
    result = claim_due_jobs("beat-1", 10)
    assert [q.job_id for q in result.quarantined] == [job.pk]
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.scheduled_for) == ("quarantined", job.scheduled_for)
    assert "cannot be computed" in record.detail


def test_explain_says_when_a_time_is_no_occurrence_and_when_it_has_not_come():
    job = api.schedule("project.tasks.record", cron="0 8 * * *", timezone="Europe/Paris")
    nxt = job.scheduled_for
    # A naive time is read in the job's zone: 08:00 Paris is an occurrence, 08:30 is not
    local = nxt.astimezone(ZoneInfo("Europe/Paris")).replace(tzinfo=None)
    pending = explain.explain(job, local)
    assert pending.nominal and "has not run yet: it is due at" in pending.text
    off = explain.explain(job, local + timedelta(minutes=30))
    assert not off.nominal and off.before == nxt and "not an occurrence" in off.text
    later = explain.explain(job, local + timedelta(days=3))
    assert later.nominal and "has not come yet" in later.text
    old = explain.explain(job, local - timedelta(days=30))
    assert "before the job existed" in old.text


def test_the_command_explains_an_occurrence_and_prints_a_timeline_and_the_fleet():
    job = job_missing(5 * MINUTE, 4, name="report", misfire_policy="skip")
    first = job.scheduled_for
    claim_due_jobs("beat-1", 10)
    out = io.StringIO()
    call_command("schedapp_explain", "report", "--at", first.isoformat(), stdout=out)
    assert "did not run" in out.getvalue() and "misfire policy skip" in out.getvalue()
    out = io.StringIO()
    call_command("schedapp_explain", str(job.pk), "--json", stdout=out)
    [entry] = json.loads(out.getvalue())
    assert (entry["fate"], entry["count"]) == ("misfired", 4)
    out = io.StringIO()
    call_command("schedapp_explain", "--fleet", "--json", stdout=out)
    fleet = json.loads(out.getvalue())
    assert fleet["occurrences_by_fate"] == {"misfired": 4}
    assert [r["name"] for r in fleet["records"]] == ["report"]


def test_records_are_pruned_with_the_runs():
    job = job_missing(MINUTE, 5, misfire_policy="skip")
    claim_due_jobs("beat-1", 10)
    Occurrence.objects.filter(job=job).update(recorded_at=db_now() - timedelta(days=40))
    result = prune_runs(timedelta(days=30))
    assert result.deleted == 1 and not Occurrence.objects.exists()


def test_a_run_now_shows_as_a_manual_run_in_the_timeline():
    job = api.schedule("project.tasks.record", cron="0 8 * * *", name="daily")
    api.run_now(job)
    (run,) = claim_due_jobs("beat-1", 10).runs
    [entry] = explain.timeline(job)
    assert (entry.fate, entry.kind, entry.first) == ("ran", "manual", run.scheduled_for)
    assert "a manual run" in explain.explain(job, run.scheduled_for).text


def test_a_run_keeps_the_kind_it_was_claimed_as_when_the_schedule_changes_after():
    # Given a run of 08:00 claimed as scheduled, then a run now, then a retry of it
    job = api.schedule("project.tasks.record", cron="0 8 * * *", name="moved")
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now(), scheduled_for=db_now())
    (scheduled,) = claim_due_jobs("beat-1", 10).runs
    assert admit_run(scheduled.job_id, scheduled.token, "w1", "a1") == "admitted"
    assert complete_run(scheduled.job_id, scheduled.token, lease.SUCCEEDED).applied
    api.run_now(job)
    (manual,) = claim_due_jobs("beat-1", 10).runs
    assert admit_run(manual.job_id, manual.token, "w1", "a2") == "admitted"
    assert complete_run(manual.job_id, manual.token, lease.FAILED, error="boom").applied
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now())
    (retry,) = claim_due_jobs("beat-1", 10).runs
    # When the schedule changes (neither time is an occurrence of the new one)
    api.update(job, cron="30 9 * * *")
    # Then each run says what it was claimed as, and so do the timeline and the task
    kinds = dict(JobRun.objects.filter(job=job).values_list("token", "kind"))
    assert kinds == {scheduled.token: "scheduled", manual.token: "manual", retry.token: "retry"}
    by_time = {e.first: e.kind for e in explain.timeline(job)}
    assert by_time == {scheduled.scheduled_for: "scheduled", manual.scheduled_for: "manual"}
    info = RunInfo(job.pk, scheduled.run_id, scheduled.token, scheduled.scheduled_for, 1, "k")
    assert info.kind == "scheduled"
    retried = RunInfo(job.pk, retry.run_id, retry.token, retry.scheduled_for, 2, "k")
    assert retried.kind == "retry"


def test_a_run_knows_its_data_interval_and_kind():
    job = api.schedule("project.tasks.record", cron="0 8 * * *", timezone="Europe/Paris")
    at = job.scheduled_for
    info = RunInfo(job.pk, 1, 1, at, 1, "key")
    # The interval runs from the occurrence before (08:00 the day before) to this one
    assert info.data_interval == (at - timedelta(days=1), at)
    assert info.kind == "scheduled"
    assert RunInfo(job.pk, 2, 2, at, 2, "key").kind == "retry"
    manual = RunInfo(job.pk, 3, 3, at + timedelta(minutes=7), 1, "key")
    assert manual.kind == "manual" and manual.data_interval == (at, at + timedelta(minutes=7))


def test_an_occurrence_refused_at_the_door_because_the_job_was_paused_has_one_fate():
    """Claimed, then paused before its message reached a worker: the door refuses it (its run
    is closed skipped, never started). Resumed later than its grace, the job records what
    passed while paused, the refused occurrence included: that is its fate, and explain and
    the timeline say so once (they said it ran, beside the record: the chaos run's ledger
    check found the occurrence with two fates)."""
    job = api.schedule(
        "project.tasks.record",
        interval=1,
        interval_anchor=db_now() - timedelta(seconds=0.5),
        name="paused-at-the-door",
        misfire_grace=0,
    )
    due = job.next_run_at - timedelta(seconds=1)  # the occurrence before its first: due now
    Job.objects.filter(pk=job.pk).update(scheduled_for=due, next_run_at=due)
    (run,) = claim_due_jobs("beat-1", 10).runs
    api.pause(job)
    assert admit_run(run.job_id, run.token, "w1", admission="w1-1") == "job_paused"
    time.sleep(1.2)  # the next occurrence (or two) passes while it is paused
    api.resume(job)
    # Then the refused occurrence is recorded as passed while paused, and that is what explain
    # answers for it (its dispatch said as such); the timeline shows it once, in that record
    [record] = Occurrence.objects.filter(job=job)
    assert record.fate == "paused"
    assert record.scheduled_for == run.scheduled_for
    answer = explain.explain(job, run.scheduled_for)
    assert answer.entry is not None and answer.entry.fate == "paused"
    assert "dispatched 1 time(s) before; none started" in answer.text
    holding = [e for e in explain.timeline(job) if e.first <= run.scheduled_for <= e.last]
    assert [e.fate for e in holding] == ["paused"]
