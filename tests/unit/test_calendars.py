"""Calendars (schedapp/calendars.py): each rule against a reference predicate written apart
from the span algebra, combinations as set algebra, and a job's fires under every mode and
roll: never inside an exclusion, moved to the nearest allowed day in the roll's direction."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import holidays
import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp import calendars as cal
from schedapp import schedules
from schedapp.exceptions import ScheduleError

Pred = Callable[[datetime], bool]
DAYS = cal.WEEKDAY_NAMES


# --- generated calendars, each with a reference predicate over a naive wall time ----------


def _sec(wall: datetime) -> int:
    return wall.hour * 3600 + wall.minute * 60 + wall.second


@st.composite
def leaves(draw: st.DrawFn) -> tuple[dict, Pred]:
    kind = draw(st.sampled_from(["weekdays", "dates", "time_range", "cron"]))
    if kind == "weekdays":
        days = draw(st.sets(st.integers(0, 6), min_size=1, max_size=3))
        return {"weekdays": [DAYS[d] for d in days]}, lambda w: w.weekday() in days
    if kind == "dates":
        picked = draw(
            st.sets(st.dates(date(2026, 1, 1), date(2026, 3, 31)), min_size=1, max_size=20)
        )
        return {"dates": [d.isoformat() for d in picked]}, lambda w: w.date() in picked
    if kind == "time_range":
        start = draw(st.integers(0, 23)) * 3600 + draw(st.sampled_from([0, 15, 30])) * 60
        end = draw(st.integers(0, 24)) * 3600
        if end == start or (end == 86400 and start == 0):
            end = (start + 3600) % 86400
        days = draw(st.none() | st.sets(st.integers(0, 6), min_size=1, max_size=6))
        body = {"start": _hhmm(start), "end": _hhmm(end)}
        if days is not None:
            body["weekdays"] = [DAYS[d] for d in days]

        def starts(day: date) -> bool:
            return days is None or day.weekday() in days

        end_mod = end % 86400

        def in_range(w: datetime) -> bool:
            s = _sec(w)
            if start < end_mod or (end == 86400):
                return starts(w.date()) and start <= s < (end if end == 86400 else end_mod)
            return (starts(w.date()) and s >= start) or (
                starts(w.date() - timedelta(days=1)) and s < end_mod
            )

        return {"time_range": body}, in_range
    expr = draw(st.sampled_from(["* 0-5 * * *", "*/20 9-17 * * 1-5", "0 12 1,15 * *", "* * * * 6"]))
    return {"cron": expr}, lambda w: croniter.match(expr, w.replace(second=0, microsecond=0))


def _hhmm(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"


def rules(depth: int = 2) -> st.SearchStrategy[tuple[dict, Pred]]:
    if depth == 0:
        return leaves()
    inner = rules(depth - 1)

    @st.composite
    def combined(draw: st.DrawFn) -> tuple[dict, Pred]:
        op = draw(st.sampled_from(["union", "difference"]))
        parts = draw(st.lists(inner, min_size=1, max_size=3))
        preds = [p for _, p in parts]
        defn = {op: [d for d, _ in parts]}
        if op == "union":
            return defn, lambda w: any(p(w) for p in preds)
        return defn, lambda w: preds[0](w) and not any(p(w) for p in preds[1:])

    return st.one_of(leaves(), combined())


walls = st.datetimes(datetime(2026, 1, 1), datetime(2026, 3, 31, 23, 59, 59))


@given(rules(), st.lists(walls, min_size=1, max_size=20))
def test_excludes_equals_the_reference_predicate(rule: tuple[dict, Pred], when: list) -> None:
    calendar = cal.parse_calendar("c", rule[0])
    for wall in when:
        assert cal.excludes(calendar.rule, wall) == rule[1](wall), (rule[0], wall)


@given(rules(1), rules(1), walls, st.dates(date(2026, 1, 1), date(2026, 3, 31)))
def test_union_difference_complement_are_set_algebra(a, b, wall, day) -> None:
    ra, rb = cal.parse_calendar("a", a[0]).rule, cal.parse_calendar("b", b[0]).rule
    union, diff = cal.Union((ra, rb)), cal.Difference(ra, (rb,))
    assert cal.excludes(union, wall) == (cal.excludes(ra, wall) or cal.excludes(rb, wall))
    assert cal.excludes(diff, wall) == (cal.excludes(ra, wall) and not cal.excludes(rb, wall))
    assert cal.excludes(cal.Complement(ra), wall) != cal.excludes(ra, wall)
    for spans in (union.spans(day), diff.spans(day), cal.Complement(ra).spans(day)):
        flat = [x for span in spans for x in span]
        assert flat == sorted(flat) and len(set(flat)) == len(flat)  # sorted, never touching
        assert all(0 <= s < e <= cal.DAY for s, e in spans)
    # (A u B) - B == A - B, A - A is empty, A u A == A
    assert cal.Difference(union, (rb,)).spans(day) == diff.spans(day)
    assert cal.Difference(ra, (ra,)).spans(day) == ()
    assert cal.Union((ra, ra)).spans(day) == ra.spans(day)


# --- a job's fires under a calendar ---------------------------------------------------------

SCHEDULES = ["0 9 * * *", "30 2 * * *", "0 9 L * *", "*/30 * * * *", "0 9,15 * * 1-5", "0 12 1 * *"]
ZONES = ["UTC", "Europe/Paris", "America/New_York"]
# A rule, a cron, its zone, the calendar's mode and roll, and when to start looking.
JOB_UNDER_A_CALENDAR = (
    rules(),
    st.sampled_from(SCHEDULES),
    st.sampled_from(ZONES),
    st.sampled_from(cal.MODES),
    st.sampled_from(cal.ROLLS),
    st.datetimes(datetime(2025, 12, 1), datetime(2026, 3, 1), timezones=st.just(UTC)),
)


def _fires(schedule, attached: cal.Attached, tz: ZoneInfo, start: datetime, n: int) -> list:
    """The first ``n`` runs after ``start``, each searched from the one before (fewer when
    the calendar leaves no more)."""
    fires: list[cal.Fire] = []
    after = start
    for _ in range(n):
        fire = cal.next_fire(schedule, attached, after, tz)
        if fire is None:
            break
        fires.append(fire)
        after = fire.at
    return fires


def _check_fires(schedule, attached: cal.Attached, tz: ZoneInfo, start: datetime, n: int) -> None:
    rule = attached.excluded
    after = start
    for fire in _fires(schedule, attached, tz, start, n):
        wall = fire.at.astimezone(tz).replace(tzinfo=None)
        assert fire.at > after
        assert not cal.excludes(rule, wall), (fire, wall)
        occ = fire.occurrence.astimezone(tz).replace(tzinfo=None)
        if fire.roll in cal.DAY_ROLLS:
            # on a wholly excluded day, moved to the nearest day that is not, same wall time
            assert cal.whole_day(rule, occ.date())
            step = 1 if fire.roll == "next_business_day" else -1
            assert (wall.date() - occ.date()).days * step > 0
            day = occ.date() + timedelta(days=step)
            while day != wall.date():
                assert cal.whole_day(rule, day), (fire, day)
                day += timedelta(days=step)
            assert not cal.whole_day(rule, wall.date())
            same_time = datetime.combine(wall.date(), occ.time())
            assert wall == same_time or not cal.cronmath.exists(same_time, tz)  # a gap's end
        elif fire.roll == "defer":
            # every moment from the occurrence to the fire is excluded; the fire is the end
            assert fire.at > fire.occurrence
            step = (fire.at - fire.occurrence) / 40
            for i in range(40):
                moment = (fire.occurrence + step * i).astimezone(tz).replace(tzinfo=None)
                assert cal.excludes(rule, moment), (fire, moment)
        else:
            assert fire.at == fire.occurrence
        for skipped in fire.skipped:
            if skipped.reason == "excluded":
                for moment in (skipped.first, skipped.last):
                    assert cal.excludes(rule, moment.astimezone(tz).replace(tzinfo=None))
                assert skipped.count >= 1
        after = fire.at


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(*JOB_UNDER_A_CALENDAR)
def test_a_fire_is_never_inside_an_exclusion_and_rolls_land_nearest(
    rule, expr, zone, mode, roll, start
) -> None:
    calendar = cal.parse_calendar("c", rule[0])
    schedule = schedules.parse_cron(expr, zone)
    _check_fires(schedule, cal.Attached(calendar, mode, roll), ZoneInfo(zone), start, 8)


def _check_accounting(schedule, attached: cal.Attached, tz: ZoneInfo, start: datetime, n: int):
    """Every occurrence of the schedule from ``start`` to the last run's is accounted for
    exactly once: run (a fire's occurrence) or in one skipped range (DESIGN 26)."""
    fires = _fires(schedule, attached, tz, start, n)
    if not fires:
        return
    seen: Counter[datetime] = Counter()
    for fire in fires:
        seen[fire.occurrence] += 1
        for skipped in fire.skipped:
            listed = [skipped.first, *schedules.fire_times(schedule, skipped.first, skipped.last)]
            assert listed[-1] == skipped.last and len(listed) == skipped.count, skipped
            seen.update(listed)
    assert max(seen.values()) == 1, [(k, v) for k, v in seen.items() if v > 1]
    bound = max(f.occurrence for f in fires)
    raw = list(schedules.fire_times(schedule, start, bound))
    assert sorted(seen)[: len(raw)] == raw, (set(raw) - set(seen), set(seen) - set(raw))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(*JOB_UNDER_A_CALENDAR)
def test_every_occurrence_is_run_or_recorded_once(rule, expr, zone, mode, roll, start) -> None:
    calendar = cal.parse_calendar("c", rule[0])
    schedule = schedules.parse_cron(expr, zone)
    start = start.replace(second=17, microsecond=123)  # never a run's own time
    _check_accounting(schedule, cal.Attached(calendar, mode, roll), ZoneInfo(zone), start, 8)


@settings(deadline=None)
@given(
    st.sampled_from(cal.ROLLS),
    st.sampled_from(ZONES),
    st.datetimes(datetime(2026, 1, 1), datetime(2026, 12, 1), timezones=st.just(UTC)),
)
def test_an_interval_job_under_a_weekend_and_night_calendar(roll, zone, start) -> None:
    definition = {
        "union": [{"weekdays": ["sat", "sun"]}, {"time_range": {"start": "22:00", "end": "06:00"}}]
    }
    calendar = cal.parse_calendar("c", definition)
    schedule = schedules.parse_interval(7 * 3600 + 13)
    _check_fires(schedule, cal.Attached(calendar, "exclude", roll), ZoneInfo(zone), start, 12)


def test_skip_crosses_a_long_exclusion_in_one_step_and_counts_it() -> None:
    calendar = cal.parse_calendar("c", {"dates": [f"2026-08-{d:02d}" for d in range(1, 15)]})
    schedule = schedules.parse_cron("* * * * *", "UTC")
    after = datetime(2026, 7, 31, 23, 59, tzinfo=UTC)
    fire = cal.next_fire(schedule, cal.Attached(calendar), after, ZoneInfo("UTC"))
    assert fire is not None and fire.at == datetime(2026, 8, 15, tzinfo=UTC)
    (skipped,) = fire.skipped
    assert (skipped.first, skipped.last, skipped.count) == (
        datetime(2026, 8, 1, tzinfo=UTC),
        datetime(2026, 8, 14, 23, 59, tzinfo=UTC),
        14 * 1440,
    )


def test_only_mode_runs_inside_the_windows_and_defer_waits_for_one() -> None:
    calendar = cal.parse_calendar("w", {"time_range": {"start": "01:00", "end": "03:00"}})
    schedule = schedules.parse_cron("0 * * * *", "UTC")
    tz = ZoneInfo("UTC")
    at = datetime(2026, 5, 1, 3, tzinfo=UTC)
    fire = cal.next_fire(schedule, cal.Attached(calendar, "only", "skip"), at, tz)
    assert fire is not None and fire.at == datetime(2026, 5, 2, 1, tzinfo=UTC)
    fire = cal.next_fire(schedule, cal.Attached(calendar, "only", "skip"), fire.at, tz)
    assert fire is not None and fire.at == datetime(2026, 5, 2, 2, tzinfo=UTC)
    deferred = cal.next_fire(
        schedules.parse_cron("30 12 * * *", "UTC"), cal.Attached(calendar, "only", "defer"), at, tz
    )
    assert deferred is not None and deferred.at == datetime(2026, 5, 2, 1, tzinfo=UTC)
    assert deferred.occurrence == datetime(2026, 5, 1, 12, 30, tzinfo=UTC)


def test_friday_night_freeze_crosses_midnight() -> None:
    freeze = cal.parse_calendar(
        "freeze", {"time_range": {"start": "18:00", "end": "06:00", "weekdays": ["fri"]}}
    ).rule
    assert cal.excludes(freeze, datetime(2026, 12, 4, 18, 0))  # Friday
    assert cal.excludes(freeze, datetime(2026, 12, 5, 5, 59, 59))  # Saturday morning
    assert not cal.excludes(freeze, datetime(2026, 12, 5, 6, 0))
    assert not cal.excludes(freeze, datetime(2026, 12, 3, 23, 0))  # Thursday night
    assert not cal.excludes(freeze, datetime(2026, 12, 4, 5, 0))  # Friday morning


# --- validation names the field -------------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "field"),
    [
        ({"holidays": {"country": "XX"}}, "definition.holidays.country"),
        ({"holidays": {"country": "DE", "subdivision": "ZZ"}}, "definition.holidays.subdivision"),
        ({"dates": ["2026-02-30"]}, "definition.dates[0]"),
        ({"dates": []}, "definition.dates"),
        ({"weekdays": ["funday"]}, "definition.weekdays[0]"),
        ({"time_range": {"start": "25:00", "end": "01:00"}}, "definition.time_range.start"),
        ({"time_range": {"start": "10:00", "end": "10:00"}}, "definition.time_range.end"),
        ({"time_range": {"start": "10:00"}}, "definition.time_range"),
        ({"cron": "61 * * * *"}, "definition.cron"),
        ({"union": []}, "definition.union"),
        ({"union": [{"weekdays": ["sat"]}, {"nope": 1}]}, "definition.union[1]"),
        ({"weekdays": ["sat"], "dates": ["2026-01-01"]}, "definition"),
        ({"calendar": "missing"}, "definition.calendar"),
    ],
)
def test_a_bad_definition_names_its_field(definition, field) -> None:
    with pytest.raises(ScheduleError) as caught:
        cal.parse_calendar("c", definition)
    assert caught.value.field == field


def test_references_resolve_and_cycles_are_refused() -> None:
    stored = {
        "weekend": {"weekdays": ["sat", "sun"]},
        "closed": {"union": [{"calendar": "weekend"}, {"dates": ["2026-12-24"]}]},
        "a": {"calendar": "b"},
        "b": {"union": [{"weekdays": ["mon"]}, {"calendar": "a"}]},
    }
    closed = cal.parse_calendar("closed", stored["closed"], stored)
    assert cal.excludes(closed.rule, datetime(2026, 12, 5, 12))  # Saturday
    assert cal.excludes(closed.rule, datetime(2026, 12, 24, 12))
    assert not cal.excludes(closed.rule, datetime(2026, 12, 23, 12))
    assert cal.references(stored["closed"]) == {"weekend"}
    with pytest.raises(ScheduleError, match="cycle") as caught:
        cal.parse_calendar("a", stored["a"], stored)
    assert caught.value.field == "definition.calendar.union[1].calendar"


def test_a_calendar_that_excludes_everything_is_refused() -> None:
    every_day = cal.parse_calendar("all", {"weekdays": list(DAYS)}).rule
    with pytest.raises(ScheduleError, match="nothing could run") as caught:
        cal.check_allows_something(every_day, date(2026, 1, 1))
    assert caught.value.field == "definition"
    cal.check_allows_something(
        cal.parse_calendar("we", {"weekdays": ["sat"]}).rule, date(2026, 1, 1)
    )


def test_a_job_the_calendar_never_lets_run_is_refused_on_calendar() -> None:
    weekend = cal.parse_calendar("weekend", {"weekdays": ["sat", "sun"]})
    saturdays = schedules.parse_cron("0 9 * * 6", "UTC")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ScheduleError) as caught:
        cal.check_job(saturdays, cal.Attached(weekend, "exclude", "skip"), now, ZoneInfo("UTC"))
    assert caught.value.field == "calendar"
    fire = cal.check_job(
        saturdays, cal.Attached(weekend, "exclude", "next_business_day"), now, ZoneInfo("UTC")
    )
    assert fire.at == datetime(2026, 1, 5, 9, tzinfo=UTC) and fire.roll == "next_business_day"
    # only mode with a past date: nothing left
    gone = cal.parse_calendar("gone", {"dates": ["2025-06-01"]})
    with pytest.raises(ScheduleError) as caught:
        cal.check_job(saturdays, cal.Attached(gone, "only", "skip"), now, ZoneInfo("UTC"))
    assert caught.value.field == "calendar"


# --- against the holidays package: 10 countries, 5 years ------------------------------------

COUNTRIES = ["US", "GB", "DE", "FR", "JP", "BR", "IN", "AU", "CA", "ZA"]
YEARS = range(2026, 2031)


@pytest.mark.parametrize("country", COUNTRIES)
def test_business_day_rolls_equal_an_independent_reckoning(country: str) -> None:
    """Next business day of every day, first and last business day of every month: computed
    here from ``holidays`` and ``date.weekday()`` alone, equal to schedapp's rolls."""
    off = set(holidays.country_holidays(country, years=range(2025, 2032)))

    def closed(day: date) -> bool:
        return day.weekday() >= 5 or day in off

    calendar = cal.parse_calendar(
        country, {"union": [{"holidays": {"country": country}}, {"weekdays": ["sat", "sun"]}]}
    )
    tz = ZoneInfo("UTC")
    day = date(2026, 1, 1)
    while day.year in YEARS:
        expected = day + timedelta(days=1)
        while closed(expected):
            expected += timedelta(days=1)
        assert cal.next_business_day(calendar.rule, day) == expected, day
        assert cal.whole_day(calendar.rule, day) == closed(day)
        day += timedelta(days=1)

    last = cal.Attached(calendar, "exclude", "previous_business_day")
    first = cal.Attached(calendar, "exclude", "next_business_day")
    last_schedule = schedules.parse_cron("0 17 L * *", "UTC")
    first_schedule = schedules.parse_cron("0 9 1 * *", "UTC")
    after_last = after_first = datetime(2025, 12, 31, 18, tzinfo=UTC)
    for year in YEARS:
        for month in range(1, 13):
            month_end = (date(year, month, 28) + timedelta(days=4)).replace(day=1) - timedelta(
                days=1
            )
            expected_last = month_end
            while closed(expected_last):
                expected_last -= timedelta(days=1)
            expected_first = date(year, month, 1)
            while closed(expected_first):
                expected_first += timedelta(days=1)
            fire = cal.next_fire(last_schedule, last, after_last, tz)
            assert fire is not None
            assert fire.at == datetime(2000, 1, 1, 17, tzinfo=UTC).replace(
                year=year, month=month, day=expected_last.day
            ), (country, year, month)
            assert (fire.roll is not None) == (expected_last != month_end)
            fire_first = cal.next_fire(first_schedule, first, after_first, tz)
            assert fire_first is not None
            assert fire_first.at == datetime.combine(
                expected_first, datetime.min.time(), UTC
            ).replace(hour=9)
            after_last, after_first = fire.at, fire_first.at


def test_a_previous_business_day_run_is_not_recorded_again() -> None:
    """Found by the accounting property: with only Saturdays open, Monday's 09:00 and 15:00
    roll back to Saturday; the search after Saturday's 15:00 run met Monday's 09:00 again
    and recorded it merged although it had run (as Saturday's 09:00)."""
    only_saturdays = cal.parse_calendar("sat", {"weekdays": ["sat"]})
    schedule = schedules.parse_cron("0 9,15 * * 1-5", "UTC")
    attached = cal.Attached(only_saturdays, "only", "previous_business_day")
    start = datetime(2025, 12, 1, 0, 0, 17, tzinfo=UTC)
    _check_accounting(schedule, attached, ZoneInfo("UTC"), start, 8)
    fire = cal.next_fire(schedule, attached, start, ZoneInfo("UTC"))
    assert fire is not None
    assert (fire.at, fire.occurrence) == (
        datetime(2025, 11, 29, 9, tzinfo=UTC) + timedelta(days=7),  # Saturday 6 December
        datetime(2025, 12, 8, 9, tzinfo=UTC),  # for Monday 8 December
    )
    assert [(s.count, s.reason) for s in fire.skipped] == [(10, "merged")]  # the week before


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["sat", "2026-01-01", "DE", "BY", "22:00", "24:00", "* * * * *", "c"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    *"holidays dates weekdays time_range cron union difference calendar".split(),
                    "country",
                    "subdivision",
                    "start",
                    "end",
                    "x",
                ]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@given(JSON, st.dates(date(2026, 1, 1), date(2026, 12, 31)))
def test_any_json_is_a_calendar_or_a_named_error(definition, day) -> None:
    """Generated definitions (DESIGN 25): a calendar whose every day reads, or a
    ScheduleError naming a field of the definition; nothing else escapes."""
    try:
        calendar = cal.parse_calendar("c", definition, {"c": definition})
    except ScheduleError as exc:
        assert exc.field.startswith("definition")
        return
    spans = calendar.rule.spans(day)
    assert all(0 <= s < e <= cal.DAY for s, e in spans)


def test_a_definition_past_the_size_limit_is_refused() -> None:
    many = {"union": [{"weekdays": ["sat"]}] * (cal.MAX_RULES + 1)}
    with pytest.raises(ScheduleError, match="rules") as caught:
        cal.parse_calendar("big", many)
    assert caught.value.field == "definition"


def test_the_ends_of_time_give_no_run_not_an_error() -> None:
    weekend = cal.parse_calendar("we", {"weekdays": ["sat", "sun"]})
    assert cal.next_business_day(weekend.rule, date(9999, 12, 31)) is None
    assert cal.previous_business_day(weekend.rule, date(1, 1, 1)) is None
    fridays = cal.parse_calendar("fri", {"weekdays": ["fri"]})
    assert cal.allowed_at_or_after(fridays.rule, datetime(9999, 12, 31, 12)) is None  # last day
    last_friday = schedules.parse_cron("0 9 * * 5", "UTC")  # 9999-12-31, rolled past the end
    attached = cal.Attached(fridays, "exclude", "next_business_day")
    after = datetime(9999, 12, 30, tzinfo=UTC)
    assert cal.next_fire(last_friday, attached, after, ZoneInfo("UTC")) is None


def test_excluded_days_lists_the_whole_days() -> None:
    rule = cal.parse_calendar(
        "c",
        {"union": [{"dates": ["2026-12-24"]}, {"time_range": {"start": "22:00", "end": "23:00"}}]},
    ).rule
    assert cal.excluded_days(rule, date(2026, 12, 20), date(2026, 12, 27)) == [date(2026, 12, 24)]
