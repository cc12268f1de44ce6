"""A job following a calendar (issue 31 item 2): a holiday calendar with a next-business-day
roll through scheduling, completion (success; failure then the next occurrence), a misfire
after an outage and a resume, with what the calendar excluded or merged in the ledger under
its name. Expected runs come from an oracle written here (a business day is a weekday that is
not one of the holidays), relative to the database's clock, so the test holds on any date."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import pytest
from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp import api, calendars, lease
from schedapp.db import db_now
from schedapp.explain import explain
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobChange, JobRun, JobState, Occurrence
from schedapp.store import PortableStore
from tests import examples

pytestmark = [pytest.mark.django_db]
TASK = "project.tasks.record"
NINE = time(9, 0)


def holidays_around(today: date) -> list[date]:
    """Two weekdays in the past fortnight and one in the next, as holidays."""
    out = []
    for delta in (-12, -5, 4):
        day = today + timedelta(days=delta)
        while day.weekday() >= 5:
            day += timedelta(days=1)
        out.append(day)
    return out


def business(day: date, holidays: list[date]) -> bool:
    return day.weekday() < 5 and day not in holidays


def next_business_nine(after: datetime, holidays: list[date]) -> datetime:
    """The oracle: the first 09:00 UTC after ``after`` on a business day (an occurrence on a
    holiday or weekend rolls to the next business day's 09:00, which is that day's own)."""
    day = after.date()
    while True:
        at = datetime.combine(day, NINE, tzinfo=UTC)
        if at > after and business(day, holidays):
            return at
        day += timedelta(days=1)


def latest_business_nine(until: datetime, holidays: list[date]) -> datetime:
    day = until.date()
    while True:
        at = datetime.combine(day, NINE, tzinfo=UTC)
        if at <= until and business(day, holidays):
            return at
        day -= timedelta(days=1)


@pytest.fixture(params=["postgresql", "portable"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The claim and the door through each store: PostgreSQL's statements, or the portable
    store's ORM (SQLite's path, on this database as bulk scheduling's tests force it)."""
    if request.param == "portable":
        from schedapp.lease import claim, door

        monkeypatch.setattr(claim, "get_store", PortableStore)
        monkeypatch.setattr(door, "get_store", PortableStore)
    return request.param


@pytest.fixture
def holidays() -> list[date]:
    return holidays_around(db_now().date())


@pytest.fixture
def office(holidays: list[date]) -> str:
    api.save_calendar(
        "office",
        {"union": [{"weekdays": ["sat", "sun"]}, {"dates": [d.isoformat() for d in holidays]}]},
    )
    return "office"


def payroll(**options) -> Job:
    return api.schedule(
        TASK,
        name=options.pop("name", "payroll"),
        cron=options.pop("cron", "0 9 * * *"),
        timezone="UTC",
        calendar=options.pop("calendar", "office"),
        calendar_roll=options.pop("calendar_roll", "next_business_day"),
        **options,
    )


def run_due(job: Job, outcome: str = lease.SUCCEEDED) -> Job:
    """Claim the job (made due now), admit and complete its run, as a beat and worker do."""
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (run,) = claim_due_jobs("beat-1", 10).runs
    admit_run(job.pk, run.token, "w1", f"a{run.token}")
    assert complete_run(job.pk, run.token, outcome, error="boom").applied
    job.refresh_from_db()
    return job


def ledger(job: Job) -> list[tuple[date, str, int]]:
    return [
        (o.scheduled_for.date(), o.fate, o.count)
        for o in Occurrence.objects.filter(job=job).order_by("scheduled_for")
    ]


def test_schedule_puts_the_first_run_on_the_next_business_day(office, holidays):
    now = db_now()
    job = payroll()
    assert job.scheduled_for == next_business_nine(now, holidays)
    assert job.calendar.name == "office"
    assert (job.calendar_mode, job.calendar_roll) == ("exclude", "next_business_day")


def test_completion_follows_the_calendar_and_the_ledger_names_it(store, office, holidays):
    job = payroll()
    start = datetime.combine(holidays[0] - timedelta(days=3), NINE, tzinfo=UTC)
    start = latest_business_nine(start, holidays)
    Job.objects.filter(pk=job.pk).update(scheduled_for=start)
    at = start
    for outcome in (lease.SUCCEEDED, lease.SUCCEEDED, lease.SUCCEEDED, lease.SUCCEEDED):
        job = run_due(job, outcome)
        expected = next_business_nine(at, holidays)
        assert job.scheduled_for == expected, (at, job.scheduled_for, expected)
        at = expected
    # every day passed between runs is in the ledger as merged, under the calendar's name
    passed = {
        start.date() + timedelta(days=n)
        for n in range(1, (at.date() - start.date()).days)
        if not business(start.date() + timedelta(days=n), holidays)
    }
    records = Occurrence.objects.filter(job=job)
    covered = set()
    for o in records:
        assert o.fate == "merged" and "'office'" in o.detail, (o.fate, o.detail)
        covered |= {o.scheduled_for.date() + timedelta(days=n) for n in range(o.count)}
    assert passed <= covered


def test_a_failure_going_on_to_the_next_occurrence_follows_the_calendar(store, office, holidays):
    job = payroll(max_retries=0, when_retries_exhausted="next_occurrence")
    friday = latest_business_nine(db_now() - timedelta(days=7), holidays)
    while friday.weekday() != 4 or not business(friday.date(), holidays):
        friday = latest_business_nine(friday - timedelta(days=1), holidays)
    Job.objects.filter(pk=job.pk).update(scheduled_for=friday)
    job = run_due(job, lease.FAILED)
    assert job.state == JobState.SCHEDULED and job.failed_occurrences == 1
    assert job.scheduled_for == next_business_nine(friday, holidays)
    assert job.scheduled_for.weekday() < 5


def test_a_misfire_after_an_outage_runs_the_latest_business_day_and_records_the_rest(
    store, office, holidays
):
    job = payroll(misfire_policy="run_once")
    now = db_now()
    gone = latest_business_nine(now - timedelta(days=16), holidays)
    Job.objects.filter(pk=job.pk).update(scheduled_for=gone, next_run_at=gone)
    (run,) = claim_due_jobs("beat-1", 10).runs
    latest = latest_business_nine(now, holidays)
    assert run.scheduled_for == latest
    job.refresh_from_db()
    missed_days = [
        gone.date() + timedelta(days=n)
        for n in range((latest.date() - gone.date()).days)
        if business(gone.date() + timedelta(days=n), holidays)
    ]
    assert job.missed_runs == len(missed_days)
    fates = ledger(job)
    assert sorted(d for d, fate, _ in fates if fate == "misfired") == missed_days
    merged = {
        d + timedelta(days=n) for d, fate, count in fates if fate == "merged" for n in range(count)
    }  # a daily schedule: a range is consecutive days
    assert holidays[0] in merged or holidays[0] < gone.date()
    assert holidays[1] in merged
    for o in Occurrence.objects.filter(job=job, fate="merged"):
        assert "calendar 'office'" in o.detail
    # nothing ran, or was claimed, on a day the calendar excludes
    for r in JobRun.objects.filter(job=job):
        assert business(r.scheduled_for.date(), holidays)


def test_resume_decides_the_paused_weeks_under_the_calendar(store, office, holidays):
    job = payroll(misfire_policy="run_once")
    api.pause(job)
    gone = latest_business_nine(db_now() - timedelta(days=16), holidays)
    Job.objects.filter(pk=job.pk).update(scheduled_for=gone, next_run_at=gone)
    job = api.resume(job)
    job.refresh_from_db()
    assert job.scheduled_for == latest_business_nine(db_now(), holidays)
    fates = {fate for _, fate, _ in ledger(job)}
    assert "paused" in fates and "merged" in fates


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"calendar": "no-such-calendar"}, "calendar"),
        ({"calendar": 3.5}, "calendar"),
        ({"calendar_mode": "sometimes"}, "calendar_mode"),
        ({"calendar_roll": "sideways"}, "calendar_roll"),
        ({"calendar": None, "calendar_roll": "defer"}, "calendar_roll"),
        ({"calendar": None, "calendar_mode": "only"}, "calendar_mode"),
    ],
)
def test_bad_calendar_options_name_their_field_and_write_nothing(office, options, field):
    with pytest.raises(ValidationError) as caught:
        payroll(**options)
    assert field in caught.value.message_dict
    assert not Job.objects.exists()


def test_a_one_off_under_a_calendar_is_refused(office):
    with pytest.raises(ValidationError) as caught:
        api.schedule(TASK, run_at=db_now(), calendar="office")
    assert "calendar" in caught.value.message_dict


def test_a_calendar_that_leaves_the_job_no_run_is_refused():
    api.save_calendar("mornings", {"time_range": {"start": "06:00", "end": "12:00"}})
    with pytest.raises(ValidationError) as caught:
        payroll(calendar="mornings", calendar_roll="skip")  # 09:00 is always excluded
    assert "calendar" in caught.value.message_dict
    assert not Job.objects.exists()
    with pytest.raises(ValidationError) as caught:  # only the mornings: 15:00 never inside
        api.schedule(TASK, cron="0 15 * * *", calendar="mornings", calendar_mode="only", name="x")
    assert "calendar" in caught.value.message_dict
    job = api.schedule(
        TASK, cron="0 9 * * *", calendar="mornings", calendar_roll="defer", name="deferred"
    )
    assert job.scheduled_for.astimezone(UTC).time() == time(12, 0)


def test_update_attaches_and_detaches_a_calendar_and_the_trail_records_it(office, holidays):
    job = api.schedule(TASK, name="plain", cron="0 9 * * *", timezone="UTC")
    job = api.update(job, calendar="office", calendar_roll="next_business_day")
    assert job.scheduled_for == next_business_nine(db_now(), holidays)
    change = JobChange.objects.filter(job_id=job.pk).order_by("-id").first()
    assert change.changes["calendar"] == [None, "office"]
    assert change.changes["calendar_roll"] == ["skip", "next_business_day"]
    job = api.update(job, calendar=None, calendar_roll=None)
    assert job.calendar is None and job.calendar_roll == "skip"


def test_a_calendar_a_job_follows_cannot_be_deleted(office):
    from django.db.models import ProtectedError

    payroll()
    with pytest.raises(ProtectedError):
        api.get(Job.objects.get().pk).calendar.delete()


def test_a_calendar_that_cannot_be_computed_quarantines_its_job_not_the_beat(store, office):
    job = payroll(misfire_policy="run_once")
    Job.objects.filter(pk=job.pk).update(calendar_roll="sideways")  # behind the API's back
    gone = db_now() - timedelta(days=3)
    Job.objects.filter(pk=job.pk).update(scheduled_for=gone, next_run_at=gone)
    result = claim_due_jobs("beat-1", 10)
    assert not result.runs and [q.job_id for q in result.quarantined] == [job.pk]
    assert "calendar_roll" in Job.objects.get(pk=job.pk).last_error


ROLLS = st.sampled_from(calendars.ROLLS)


@settings(
    max_examples=examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    roll=ROLLS,
    offsets=st.lists(st.integers(0, 20), max_size=6),
    window=st.tuples(st.integers(0, 23), st.integers(1, 6)),
    minute=st.integers(0, 59),
)
def test_no_run_ever_lands_inside_an_exclusion_through_the_real_completion_path(
    roll, offsets, window, minute
):
    """Hypothesis drives the real completion (claim, door, complete) of a job under a
    calendar of random holidays, weekends and a daily blackout window: every run the
    completion sets lands outside every exclusion."""
    Job.objects.all().delete()
    from schedapp.models import Calendar

    Calendar.objects.all().delete()
    today = db_now().date()
    start_h, hours = window
    definition = {
        "union": [
            {"weekdays": ["sun"]},
            {
                "time_range": {
                    "start": f"{start_h:02d}:00",
                    "end": f"{(start_h + hours) % 24:02d}:00",
                }
            },
            *(
                [{"dates": [(today + timedelta(days=o)).isoformat() for o in offsets]}]
                if offsets
                else []
            ),
        ]
    }
    saved = api.save_calendar("random", definition)
    parsed = calendars.parse_calendar("random", saved.definition)
    try:
        job = api.schedule(
            TASK,
            name="prop",
            cron=f"{minute} */3 * * *",
            timezone="Europe/Paris",
            calendar="random",
            calendar_roll=roll,
        )
    except ValidationError:
        return  # a calendar that leaves this schedule nothing is refused: nothing to run
    from zoneinfo import ZoneInfo

    paris = ZoneInfo("Europe/Paris")
    for _ in range(8):
        at = job.scheduled_for
        assert not calendars.excludes(parsed.rule, at.astimezone(paris)), (roll, at)
        job = run_due(job)
        assert job.state == JobState.SCHEDULED


def test_a_restore_or_a_duplicate_keeps_the_calendar_and_only_a_change_of_it_moves_the_run(
    office, holidays
):
    job = payroll(description="v1")
    first = job.scheduled_for
    job = api.update(job, description="v2")
    created = JobChange.objects.filter(job_id=job.pk).order_by("id").first()
    Job.objects.filter(pk=job.pk).update(scheduled_for=first + timedelta(days=1))
    # restoring the first version (its calendar by name) changes the description only
    job = api.restore(job, created)
    assert job.description == "v1"
    assert job.scheduled_for == first + timedelta(days=1)  # not recomputed
    copy = api.duplicate(job, name="payroll-copy")
    assert (copy.calendar_id, copy.calendar_roll) == (job.calendar_id, "next_business_day")
    assert copy.scheduled_for == next_business_nine(db_now(), holidays)


@pytest.mark.parametrize("overlap", ["skip", "buffer_all", "cancel_other"])
def test_a_run_that_outlasted_business_days_is_decided_by_its_overlap_policy_on_the_calendar(
    store, office, holidays, overlap
):
    # Given a run for a business day ten days ago that ends only now
    job = payroll(overlap=overlap, max_buffer=2)
    now = db_now()
    start = latest_business_nine(now - timedelta(days=10), holidays)
    Job.objects.filter(pk=job.pk).update(scheduled_for=start)
    job = run_due(job)
    # Then the business days' runs that came due meanwhile are decided by the policy
    due = []
    at = start
    while (at := next_business_nine(at, holidays)) <= db_now():
        due.append(at)
    fates = {d: f for d, f, _ in ledger(job) if f in ("overlapped", "buffer_full")}
    if overlap == "skip":
        assert job.scheduled_for == next_business_nine(db_now(), holidays)
        assert sorted(fates) == [d.date() for d in due]
    elif overlap == "buffer_all":
        assert job.scheduled_for == due[-2]  # the two most recent run, the oldest first
        assert sorted(fates) == [d.date() for d in due[:-2]]
        assert set(fates.values()) == {"buffer_full"}
    else:
        assert job.scheduled_for == due[-1]  # the latest runs now
        assert sorted(fates) == [d.date() for d in due[:-1]]
    assert job.next_run_at <= db_now() + timedelta(days=4)
    assert all(business(d, holidays) for d in fates)


# --- a fixed-delay interval under a calendar --------------------------------------------------


def fixed_delay_job(days: int, **options) -> Job:
    return api.schedule(
        TASK,
        name="fixed",
        interval=timedelta(days=days),
        fixed_delay=True,
        timezone="UTC",
        calendar="office",
        calendar_roll=options.pop("calendar_roll", "next_business_day"),
        **options,
    )


def days_to_a_closed_day(holidays: list[date]) -> int:
    """The fewest whole days from today to a day the calendar excludes (a weekend at most)."""
    today = db_now().date()
    return next(n for n in range(1, 8) if not business(today + timedelta(days=n), holidays))


def rolled(at: datetime, holidays: list[date]) -> datetime:
    """The oracle's next business day: the same time on the first business day from ``at``."""
    while not business(at.date(), holidays):
        at += timedelta(days=1)
    return at


@pytest.mark.parametrize("outcome", [lease.SUCCEEDED, lease.FAILED])
def test_a_fixed_delay_counts_from_the_run_end_then_the_calendar_rolls_it(
    store, office, holidays, outcome
):
    # Given a fixed-delay interval whose delay from today ends on a day the calendar excludes
    days = days_to_a_closed_day(holidays)
    job = fixed_delay_job(days, max_retries=0, when_retries_exhausted="next_occurrence")
    Occurrence.objects.filter(job=job).delete()  # the first run's, at the same database time
    # When its run ends (a success, or a failure going on to the next occurrence)
    job = run_due(job, outcome)
    # Then the next run is a whole delay after the run's end, rolled to the next business day
    end = job.interval_anchor
    assert end is not None
    assert job.state == JobState.SCHEDULED
    assert (
        job.scheduled_for
        == rolled(end + timedelta(days=days), holidays)
        != end + timedelta(days=days)
    )
    # ... and the ledger records the delay's end rolled (merged into the run that stands for
    # it), under the calendar's name
    (record,) = Occurrence.objects.filter(job=job, scheduled_for=end + timedelta(days=days))
    assert record.fate == "merged" and "calendar 'office'" in record.detail
    if (job.scheduled_for - end) % timedelta(days=days):  # not itself a multiple of the delay
        assert f"moved to {job.scheduled_for.isoformat()}" in record.detail


def test_a_fixed_delay_under_skip_runs_at_the_next_multiple_of_the_delay_allowed(
    store, office, holidays
):
    days = days_to_a_closed_day(holidays)
    job = fixed_delay_job(days, calendar_roll="skip")
    Occurrence.objects.filter(job=job).delete()  # the first run's, at the same database time
    job = run_due(job)
    end = job.interval_anchor
    expected = next(
        end + timedelta(days=days * k)
        for k in range(1, 30)
        if business((end + timedelta(days=days * k)).date(), holidays)
    )
    assert job.scheduled_for == expected
    records = Occurrence.objects.filter(job=job, scheduled_for__gt=end)
    assert records and all(o.fate == "excluded" for o in records)
    assert sum(o.count for o in records if o.scheduled_for < expected) == (
        (expected - end) // timedelta(days=days) - 1
    )


def test_explain_says_where_a_moved_run_was_moved_from(store):
    # Given a weekly Monday job whose next Monday is closed, rolled to the next business day
    # (the next Monday 09:00: today's, on a Monday before nine)
    now = db_now()
    monday = now.date() + timedelta(days=-now.weekday() % 7)
    if datetime.combine(monday, NINE, tzinfo=UTC) <= now:
        monday += timedelta(days=7)
    api.save_calendar("closed-monday", {"dates": [monday.isoformat()]})
    job = api.schedule(
        TASK,
        name="weekly",
        cron="0 9 * * mon",
        timezone="UTC",
        calendar="closed-monday",
        calendar_roll="next_business_day",
    )
    tuesday = datetime.combine(monday + timedelta(days=1), NINE, tzinfo=UTC)
    assert job.scheduled_for == tuesday
    # When its run there ends
    run_due(job)
    # Then the Monday says it was moved to Tuesday, and Tuesday's run says where from
    at_monday = explain(job, datetime.combine(monday, NINE, tzinfo=UTC))
    assert at_monday.entry is not None and at_monday.entry.fate == "merged"
    assert "moved to" in at_monday.text and "'closed-monday'" in at_monday.text
    at_tuesday = explain(job, tuesday)
    assert at_tuesday.entry is not None and at_tuesday.entry.fate == "ran", at_tuesday.text
    assert f"moved here from {monday.isoformat()} 09:00:00+00:00" in at_tuesday.text
    assert "calendar 'closed-monday' (exclude, roll next_business_day)" in at_tuesday.text
