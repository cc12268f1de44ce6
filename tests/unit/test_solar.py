"""Solar schedules: Celery's ``solar(event, lat, lon)`` as a pure schedule.

The oracle is Celery's own ``solar.remaining_estimate`` (with ``nowfun`` pinned to the moment
asked about): where Celery says the next event is, schedapp fires, to the second (schedapp
rounds fire times to whole seconds so that they do not depend on where a search starts), give
or take the precision of ephem's search, which Celery's estimate carries (a tenth of a second:
ephem stops at a point that depends on where it started, schedapp bisects to the crossing).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from celery.schedules import solar as celery_solar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp import solar
from schedapp.exceptions import ScheduleError
from schedapp.policies import JobFacts, plan_after_success
from schedapp.schedules import (
    Solar,
    count_fire_times,
    describe,
    fire_times,
    first_fire_time,
    next_fire_time,
    parse_solar,
    recent_fire_times,
    with_window,
)
from tests import examples
from tests.celery_sim import celery_oracle

DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)
EPSILON = timedelta(microseconds=1)
EPHEM_PRECISION = timedelta(seconds=0.1)  # ephem's default_newton_precision, Celery's error
ORACLE_APP = Celery("solar-oracle", set_as_current=False)
ORACLE_APP.conf.timezone = "UTC"
ORACLE_APP.conf.enable_utc = True

PARIS = (48.8566, 2.3522)
NEW_YORK = (40.7128, -74.0060)
TROMSO = (69.6492, 18.9553)
SYDNEY = (-33.8688, 151.2093)
EVENTS = sorted(solar.EVENTS)


def at(iso: str) -> datetime:
    value = datetime.fromisoformat(iso)
    assert value.tzinfo is not None, iso
    return value


def celery_next(event: str, place: tuple[float, float], after: datetime) -> datetime:
    schedule = celery_solar(event, *place, nowfun=lambda: after, app=ORACLE_APP)
    return after + schedule.remaining_estimate(after)


def moments(first: str, days: int, hours: tuple[int, ...]) -> list[datetime]:
    start = at(first)
    return [start + d * DAY + timedelta(hours=h) for d in range(days) for h in hours]


# --- Celery as the oracle --------------------------------------------------------------------


@celery_oracle
@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize(
    ("place", "first", "hours"),
    [
        pytest.param(PARIS, "2026-03-26T00:00+00:00", (0, 6, 12, 18), id="paris-march"),
        pytest.param(NEW_YORK, "2026-10-29T00:00+00:00", (3, 11, 17, 23), id="new-york-nov"),
        pytest.param(SYDNEY, "2026-06-18T00:00+00:00", (0, 9, 15), id="sydney-june"),
        # Midnight sun: no sunrise, sunset, dawn or dusk for weeks; solar noon every day.
        pytest.param(TROMSO, "2026-06-18T00:00+00:00", (12,), id="tromso-june"),
        # Astronomical dawn and dusk stop in Paris around the June solstice.
        pytest.param(PARIS, "2026-06-15T00:00+00:00", (22,), id="paris-white-nights"),
    ],
)
def test_given_a_week_of_moments_when_asking_the_next_event_then_it_is_celerys(
    event, place, first, hours
):
    schedule = parse_solar(event, *place)
    for after in moments(first, 7, hours):
        ours = next_fire_time(schedule, after)
        theirs = celery_next(event, place, after)
        assert ours is not None
        assert abs(ours - theirs) <= SECOND / 2 + EPHEM_PRECISION, (event, after, theirs)
        assert ours > after
        assert ours.utcoffset() == timedelta(0) and ours.microsecond == 0


@celery_oracle
@pytest.mark.parametrize(
    ("event", "after", "expected_day"),
    [
        # In Tromsø the sun does not set between late May and late July: the next sunset
        # after the solstice is in late July, the next astronomical dusk in mid-September.
        ("sunset", "2026-06-21T12:00+00:00", "2026-07-2"),
        ("sunrise", "2026-06-21T12:00+00:00", "2026-07-2"),
        ("dusk_astronomical", "2026-06-21T12:00+00:00", "2026-09-1"),
        ("solar_noon", "2026-06-21T12:00+00:00", "2026-06-22"),
        # Polar night: no sunrise from early December to mid January.
        ("sunrise", "2026-12-15T00:00+00:00", "2027-01-1"),
    ],
)
def test_given_tromso_when_an_event_does_not_happen_for_weeks_then_the_next_is_weeks_later(
    event, after, expected_day
):
    schedule = parse_solar(event, *TROMSO)
    ours = next_fire_time(schedule, at(after))
    assert ours is not None and ours.date().isoformat().startswith(expected_day)
    assert abs(ours - celery_next(event, TROMSO, at(after))) <= SECOND


# --- one event, one fire time; polar gaps bridged --------------------------------------------

MELBOURNE = (-37.81753, 144.96715)
NEAR_POLE = (89.9, 0.0)
# The event of the other direction at the same horizon: between two sunrises the sun sets.
OPPOSITE = {
    "sunrise": "sunset",
    "sunset": "sunrise",
    "dawn_civil": "dusk_civil",
    "dusk_civil": "dawn_civil",
    "dawn_nautical": "dusk_nautical",
    "dusk_nautical": "dawn_nautical",
    "dawn_astronomical": "dusk_astronomical",
    "dusk_astronomical": "dawn_astronomical",
}
YEAR_AND_A_DAY = timedelta(days=solar.SEARCH_DAYS)
SOLAR_PROPERTY = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2080, 1, 1), timezones=st.just(UTC)
)
longitudes = st.floats(-180, 180)


def test_given_melbourne_sunset_when_following_fire_times_then_each_sunset_fires_once():
    schedule = parse_solar("sunset", *MELBOURNE)
    times = list(fire_times(schedule, at("2026-03-22T09:00+00:00"), limit=4))
    # Before: 2026-03-23 08:27:34 then 08:27:35, the same sunset found again from a second
    # later (ephem's answer moves by a tenth of a second with the search start).
    assert times[0] == at("2026-03-23T08:27:35+00:00")
    assert all(DAY - timedelta(minutes=3) < b - a < DAY for a, b in itertools.pairwise(times))


@SOLAR_PROPERTY
@given(
    event=st.sampled_from(EVENTS), latitude=st.floats(-60, 60), longitude=longitudes, after=instants
)
def test_property_away_from_the_poles_successive_fire_times_are_hours_apart(
    event, latitude, longitude, after
):
    schedule = Solar(event, latitude, longitude)
    first = next_fire_time(schedule, after)
    assert first is not None and first > after
    second = next_fire_time(schedule, first)
    assert second is not None
    # One event a day at most: a rising follows the sun's lowest point of a day, about 12 h
    # after its highest; solar noons are a day apart, give or take the equation of time.
    least = timedelta(hours=23) if event == "solar_noon" else timedelta(hours=11)
    assert second - first >= least, (first, second)
    # The same event whichever moment before it the search starts from.
    assert next_fire_time(schedule, first - SECOND / 2) == first
    assert next_fire_time(schedule, first - timedelta(minutes=1)) == first


@SOLAR_PROPERTY
@given(
    event=st.sampled_from(sorted(OPPOSITE)),
    latitude=st.floats(-89.99, 89.99),
    longitude=longitudes,
    after=instants,
)
def test_property_anywhere_successive_fire_times_are_distinct_events_within_a_year(
    event, latitude, longitude, after
):
    if not solar.ever_happens(event, latitude, longitude):
        return
    schedule = Solar(event, latitude, longitude)
    first = next_fire_time(schedule, after)
    # It happens there, so it happens within a year of any moment (the sun's course repeats).
    assert first is not None and after < first <= after + YEAR_AND_A_DAY
    second = next_fire_time(schedule, first)
    assert second is not None and first < second <= first + YEAR_AND_A_DAY
    # A second sunrise is another event only if the sun set in between.
    between = solar.next_event(OPPOSITE[event], latitude, longitude, first)
    assert between is not None and first < between < second, (first, between, second)


def test_given_a_place_near_the_pole_when_the_next_sunrise_is_next_year_then_it_is_found():
    after = at("2026-03-22T09:00+00:00")
    # Before: None (ephem's search gave up on the days the sun only grazes the horizon).
    found = solar.next_event("sunrise", *NEAR_POLE, after)
    assert found is not None and found.date().isoformat().startswith("2027-03-1")
    schedule = parse_solar("sunrise", *NEAR_POLE)
    assert first_fire_time(schedule, after) == found  # before: ScheduleError on expires_at


def _facts(schedule, scheduled_for):
    return JobFacts(
        schedule=schedule,
        state="running",
        scheduled_for=scheduled_for,
        retry_count=0,
        max_retries=3,
        retry_backoff=timedelta(seconds=1),
        retry_backoff_max=timedelta(seconds=10),
        jitter=0,
    )


@pytest.mark.parametrize(
    "ran_for",
    [
        # Before: succeeded, as if the recurring job were over (no next sunrise found).
        "2026-03-22T09:00+00:00",
        # Its 2026 sunrise. Before: 2026-03-18 08:36:43, the same sunrise a second later.
        "2026-03-18T08:36:42+00:00",
    ],
)
def test_given_a_recurring_job_near_the_pole_when_a_run_succeeds_then_it_waits_for_next_year(
    ran_for,
):
    plan = plan_after_success(_facts(parse_solar("sunrise", *NEAR_POLE), at(ran_for)))
    assert plan.state == "scheduled"
    assert plan.scheduled_for is not None and plan.scheduled_for.year == 2027


def test_given_a_solar_schedule_with_no_event_when_planning_then_its_field_is_named():
    # Written behind the API's back: at the pole itself a sunrise is no daily event.
    schedule = Solar("sunrise", 90.0, 0.0)
    now = at("2026-03-22T09:00+00:00")
    with pytest.raises(ScheduleError) as excinfo:
        first_fire_time(schedule, now)
    assert excinfo.value.field == "solar_event"  # before: expires_at, a field it has not
    # A run of it does not end the job as succeeded: the error lets the caller quarantine it.
    with pytest.raises(ScheduleError) as excinfo:
        plan_after_success(_facts(schedule, now))
    assert excinfo.value.field == "solar_event"
    # Its expiry, on the other hand, does end it.
    windowed = with_window(parse_solar("sunset", *PARIS), None, now + DAY / 2)
    with pytest.raises(ScheduleError) as excinfo:
        first_fire_time(windowed, now + DAY)
    assert excinfo.value.field == "expires_at"
    assert plan_after_success(_facts(windowed, now + DAY)).state == "succeeded"


# --- the schedule functions ------------------------------------------------------------------


def test_given_a_week_in_paris_then_counts_recent_times_and_enumeration_agree():
    schedule = parse_solar("sunrise", *PARIS)
    start, end = at("2026-03-25T00:00+00:00"), at("2026-04-01T00:00+00:00")
    everything = list(fire_times(schedule, start - EPSILON, end))
    assert len(everything) == 7
    assert count_fire_times(schedule, start, end) == 7
    assert recent_fire_times(schedule, end, start, 3) == everything[-3:]
    assert (
        recent_fire_times(schedule, end, at("2000-01-01T00:00+00:00"), 10)
        == (list(fire_times(schedule, end - 12 * DAY, end))[-10:])
    )
    # Each is found again from just before it: fire times do not depend on the search start.
    assert all(next_fire_time(schedule, t - EPSILON) == t for t in everything)
    # Sunrise is about 2 minutes earlier each day in March in Paris.
    gaps = {(b - a) for a, b in itertools.pairwise(everything)}
    assert all(DAY - timedelta(minutes=3) < g < DAY for g in gaps)


def test_given_a_month_of_midnight_sun_then_no_sunset_is_counted_and_noon_is_daily():
    start, end = at("2026-06-01T00:00+00:00"), at("2026-06-30T23:59+00:00")
    assert count_fire_times(parse_solar("sunset", *TROMSO), start, end) == 0
    assert count_fire_times(parse_solar("solar_noon", *TROMSO), start, end) == 30
    assert recent_fire_times(parse_solar("sunset", *TROMSO), end, start, 5) == []


def test_given_a_year_when_counting_then_the_cost_is_a_search_per_day(monkeypatch):
    calls = []
    real = solar.next_event
    monkeypatch.setattr(solar, "next_event", lambda *a: calls.append(a) or real(*a))
    schedule = parse_solar("solar_noon", *NEW_YORK)
    start, end = at("2026-01-01T00:00+00:00"), at("2026-12-31T23:59+00:00")
    assert count_fire_times(schedule, start, end) == 365
    assert len(calls) <= 366 + 1


def test_given_a_solar_schedule_then_it_is_described_and_has_a_first_fire():
    schedule = parse_solar("dusk_civil", *NEW_YORK)
    assert describe(schedule) == "solar dusk_civil at (40.7128, -74.006)"
    now = at("2026-05-01T12:00+00:00")
    assert first_fire_time(schedule, now) == next_fire_time(schedule, now)


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "latitude", "longitude", "field"),
    [
        ("sunrize", 48.8, 2.3, "event"),
        ("Sunrise", 48.8, 2.3, "event"),
        ("", 48.8, 2.3, "event"),
        (None, 48.8, 2.3, "event"),
        ("sunrise", 90.01, 2.3, "latitude"),
        ("sunrise", -91, 2.3, "latitude"),
        ("sunrise", float("nan"), 2.3, "latitude"),
        ("sunrise", "48.8", 2.3, "latitude"),
        ("sunrise", True, 2.3, "latitude"),
        ("sunrise", None, 2.3, "latitude"),
        ("sunrise", 48.8, 180.5, "longitude"),
        ("sunrise", 48.8, -181, "longitude"),
        ("sunrise", 48.8, float("inf"), "longitude"),
        # At the poles the sun never crosses a horizon within a day: only noon happens.
        ("sunrise", 90, 0, "latitude"),
        ("dusk_civil", -90, 0, "latitude"),
    ],
)
def test_given_bad_solar_arguments_when_parsing_then_the_error_names_the_field(
    event, latitude, longitude, field
):
    with pytest.raises(ScheduleError) as excinfo:
        parse_solar(event, latitude, longitude)
    assert excinfo.value.field == field


@pytest.mark.parametrize(
    ("event", "latitude", "longitude"),
    [("solar_noon", 90, 0), ("sunrise", -89.9, 180), ("sunset", 0, -180), ("sunrise", 12, 0)],
)
def test_given_edge_coordinates_when_parsing_then_they_are_accepted(event, latitude, longitude):
    assert parse_solar(event, latitude, longitude) == Solar(event, latitude, longitude)


def test_given_ephem_missing_when_parsing_a_solar_schedule_then_the_error_says_what_to_install(
    monkeypatch,
):
    monkeypatch.setitem(sys.modules, "ephem", None)  # import ephem now raises ImportError
    with pytest.raises(ScheduleError) as excinfo:
        parse_solar("sunrise", *PARIS)
    assert excinfo.value.field == "solar"
    assert "schedapp[solar]" in str(excinfo.value)


def test_given_schedapp_schedules_when_imported_and_used_for_cron_then_ephem_is_not_imported():
    code = (
        "import sys; from datetime import datetime, UTC; from schedapp import schedules, policies;"
        "c = schedules.parse_cron('* * * * *', 'UTC');"
        "schedules.count_fire_times(c, datetime(2026, 1, 1, tzinfo=UTC), datetime.now(UTC));"
        "print('ephem' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
