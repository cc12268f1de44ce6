"""iCalendar rules (schedapp/calendars.py ``{"ical": ...}``): each event excludes exactly its
own time on the rule's wall clock, checked against occurrences written out by hand (the
fixture tests/data/closures.ics) and against generated documents whose events, recurring or
not, are reckoned here with plain datetime arithmetic; bad documents are refused on a named
field."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedapp import calendars as cal
from schedapp.exceptions import ScheduleError

FIXTURE = Path(__file__).parent.parent / "data" / "closures.ics"
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
UTC = ZoneInfo("UTC")
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]


def _rule(definition: object) -> cal.Rule:
    return cal.parse_calendar("t", definition).rule


def _exists(wall: datetime, zone: ZoneInfo) -> bool:
    """A wall time the clock shows (not one skipped by a spring change)."""
    return any(
        wall.replace(tzinfo=zone, fold=f).astimezone(UTC).astimezone(zone).replace(tzinfo=None)
        == wall
        for f in (0, 1)
    )


def _plain(wall: datetime, zone: ZoneInfo) -> bool:
    """A wall time that is one instant (no gap, no repeated hour): the reference compares
    instants there."""
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    back = first.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
    return first.utcoffset() == second.utcoffset() and back == wall


# --- the fixture, against occurrences written out by hand -----------------------------------


def _ny(day: int, month: int = 3) -> tuple[datetime, datetime]:
    start = datetime(2026, month, day, 9, 0, tzinfo=NEW_YORK)
    return start, start + timedelta(minutes=90)


FIXTURE_TIMED = [
    (datetime(2026, 3, 10, 22, 30, tzinfo=BERLIN), datetime(2026, 3, 11, 1, 15, tzinfo=BERLIN)),
    _ny(2),
    _ny(9),  # New York on summer time already, Berlin not yet: 14:00 in Berlin
    _ny(23),  # the 16th is an EXDATE
    _ny(30),  # both on summer time: 15:00 in Berlin again
    (datetime(2026, 6, 1, 8, 0, tzinfo=UTC), datetime(2026, 6, 1, 9, 0, tzinfo=UTC)),
]
FIXTURE_DAYS = {date(2026, 12, 24), date(2026, 12, 25), date(2026, 12, 26)}


def _fixture_excludes(wall: datetime) -> bool:
    if wall.date() in FIXTURE_DAYS:
        return True
    instant = wall.replace(tzinfo=BERLIN)
    return any(start <= instant < end for start, end in FIXTURE_TIMED)


def test_the_fixture_excludes_exactly_its_events_every_quarter_hour_of_2026() -> None:
    rule = _rule({"ical": FIXTURE.read_text()})
    assert rule.zone == "Europe/Berlin"  # the file's X-WR-TIMEZONE
    wall, mismatched = datetime(2026, 1, 1), []
    while wall.year == 2026:
        if _plain(wall, BERLIN) and cal.excludes(rule, wall) != _fixture_excludes(wall):
            mismatched.append(wall)
        wall += timedelta(minutes=15)
    assert mismatched == []


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (datetime(2026, 3, 10, 22, 30), datetime(2026, 3, 11, 1, 15)),  # crosses midnight
        (datetime(2026, 3, 2, 15, 0), datetime(2026, 3, 2, 16, 30)),  # New York, winter
        (datetime(2026, 3, 9, 14, 0), datetime(2026, 3, 9, 15, 30)),  # New York on DST only
        (datetime(2026, 3, 30, 15, 0), datetime(2026, 3, 30, 16, 30)),  # both on DST
        (datetime(2026, 6, 1, 10, 0), datetime(2026, 6, 1, 11, 0)),  # UTC, a duration
        (datetime(2026, 12, 24), datetime(2026, 12, 27)),  # all day, DTEND exclusive
    ],
)
def test_each_fixture_event_starts_and_ends_to_the_second(start: datetime, end: datetime) -> None:
    rule = _rule({"ical": FIXTURE.read_text()})
    second = timedelta(seconds=1)
    assert not cal.excludes(rule, start - second)
    assert cal.excludes(rule, start)
    assert cal.excludes(rule, end - second)
    assert not cal.excludes(rule, end)


def test_exdate_cancelled_and_endless_events_exclude_nothing() -> None:
    rule = _rule({"ical": FIXTURE.read_text()})
    assert cal.ical_year(rule.text, rule.zone, 2026).get(date(2026, 3, 16)) is None
    assert not cal.excludes(rule, datetime(2026, 3, 16, 14, 30))  # the EXDATE
    assert cal.excluded_days(rule, date(2026, 7, 1), date(2026, 7, 1)) == []  # STATUS:CANCELLED
    assert not cal.excludes(rule, datetime(2026, 8, 1, 12, 0))  # no DTEND: no time
    assert cal.excluded_days(rule, date(2026, 1, 1), date(2026, 12, 31)) == sorted(FIXTURE_DAYS)


def test_the_wall_clock_is_the_rules_timezone() -> None:
    text = FIXTURE.read_text()
    rule = _rule({"ical": {"text": text, "timezone": "America/New_York"}})
    assert cal.excludes(rule, datetime(2026, 3, 9, 9, 0))  # the review at 09:00 New York
    assert not cal.excludes(rule, datetime(2026, 3, 9, 14, 0))
    assert cal.excludes(rule, datetime(2026, 3, 10, 17, 30))  # 22:30 Berlin
    assert cal.excludes(rule, datetime(2026, 12, 24, 0, 0))  # all-day events are wall days
    assert not cal.excludes(rule, datetime(2026, 12, 27, 0, 0))


def test_a_job_under_the_fixture_defers_past_the_migration() -> None:
    rule = cal.parse_calendar("closures", {"ical": FIXTURE.read_text()})
    attached = cal.Attached(rule, "exclude", "defer")
    schedule = cal.schedules.parse_cron("0 * * * *", "Europe/Berlin")
    fire = cal.next_fire(schedule, attached, datetime(2026, 3, 10, 22, 0, tzinfo=BERLIN), BERLIN)
    assert fire is not None
    assert fire.at == datetime(2026, 3, 11, 1, 15, tzinfo=BERLIN)
    assert fire.occurrence == datetime(2026, 3, 10, 23, 0, tzinfo=BERLIN)


# --- generated documents, reckoned independently ---------------------------------------------


def _stamp(value: datetime) -> str:
    return value.strftime("%Y%m%dT%H%M%S")


def _document(events: list[str]) -> str:
    body = "".join(
        f"BEGIN:VEVENT\r\nUID:{i}@t\r\nDTSTAMP:20260101T000000Z\r\n{e}END:VEVENT\r\n"
        for i, e in enumerate(events)
    )
    return f"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\n{body}END:VCALENDAR\r\n"


# The days the clocks of ZONES change in 2026: events across the changes.
CHANGE_DAYS = [
    date(2026, 3, 8), date(2026, 3, 29), date(2026, 4, 5),
    date(2026, 10, 4), date(2026, 10, 25), date(2026, 11, 1),
]
YEAR = (date(2026, 1, 1), date(2026, 12, 31))


@st.composite
def events(draw: st.DrawFn) -> tuple[str, object]:
    """One event's iCalendar lines and what it excludes: ("day", first, last) whole days,
    ("wall", start, end) floating wall times, or ("instant", start, end) aware instants."""
    kind = draw(st.sampled_from(["all_day", "floating", "zoned", "utc"]))
    near_a_change = draw(st.booleans())  # early on a change day, a few hours long
    start = datetime.combine(
        draw(st.sampled_from(CHANGE_DAYS) if near_a_change else st.dates(YEAR[0], YEAR[1])),
        time(
            draw(st.integers(0, 3) if near_a_change else st.integers(0, 23)),
            draw(st.sampled_from([0, 15, 30, 45, 59])),
        ),
    )
    if kind == "all_day":
        days = draw(st.integers(1, 4))
        first = start.date()
        lines = (
            f"DTSTART;VALUE=DATE:{first:%Y%m%d}\r\nDTEND;VALUE=DATE:"
            f"{first + timedelta(days=days):%Y%m%d}\r\n"
        )
        return lines, ("day", first, first + timedelta(days=days))
    length = timedelta(minutes=draw(st.integers(1, 240 if near_a_change else 3 * 24 * 60)))
    if kind == "floating":
        lines = f"DTSTART:{_stamp(start)}\r\nDTEND:{_stamp(start + length)}\r\n"
        return lines, ("wall", start, start + length)
    zone = ZoneInfo("UTC" if kind == "utc" else draw(st.sampled_from(ZONES)))
    begin = start.replace(tzinfo=zone)
    begin = begin.astimezone(UTC).astimezone(zone)  # a wall time in a gap: its real instant
    end = begin.astimezone(UTC) + length
    if kind == "utc":
        lines = f"DTSTART:{_stamp(begin)}Z\r\nDURATION:PT{int(length.total_seconds())}S\r\n"
    else:
        # A wall time of a repeated hour is its first instant (RFC 5545): what DTEND says.
        end = end.astimezone(zone).replace(tzinfo=None).replace(tzinfo=zone, fold=0)
        assume(end > begin)  # a DTEND before DTSTART is no event
        lines = (
            f"DTSTART;TZID={zone.key}:{_stamp(begin)}\r\n"
            f"DTEND;TZID={zone.key}:{_stamp(end)}\r\n"
        )
    return lines, ("instant", begin, end)



def _reference(found: list[tuple], wall: datetime, zone: ZoneInfo) -> bool:
    for kind, start, end in found:
        if kind == "day" and start <= wall.date() < end:
            return True
        if kind == "wall" and start <= wall < end:
            return True
        if kind == "instant" and any(
            start.astimezone(UTC) <= wall.replace(tzinfo=zone, fold=f).astimezone(UTC) < end
            for f in (0, 1)
        ):  # in a repeated hour, either of the instants the wall time stands for (compared
            # in UTC: datetimes of one tzinfo compare as wall times, ignoring fold)
            return True
    return False


def _walls_near(draw: st.DrawFn, found: list[tuple], zone: ZoneInfo) -> list[datetime]:
    """Wall times at and around each event's edges (on the rule's clock), and some anywhere."""
    out = []
    for kind, start, end in found:
        for edge in (start, end):
            if kind == "day":
                edge = datetime.combine(edge, time())
            elif kind == "instant":
                edge = edge.astimezone(zone).replace(tzinfo=None)
            for delta in (-3599, -1800, -60, -1, 0, 1, 59, 1800, 3600):
                out.append(edge + timedelta(seconds=delta))
    anywhere = st.datetimes(datetime(2026, 1, 1), datetime(2026, 12, 31, 23, 59, 59))
    out += draw(st.lists(anywhere, max_size=20))
    return out


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(events(), min_size=1, max_size=6), st.sampled_from(ZONES), st.data())
def test_generated_events_exclude_exactly_their_time(found, zone_name, data) -> None:
    zone = ZoneInfo(zone_name)
    rule = _rule({"ical": {"text": _document([e for e, _ in found]), "timezone": zone_name}})
    reckoned = [what for _, what in found]
    for wall in _walls_near(data.draw, reckoned, zone):
        if wall.year == 2026 and _exists(wall, zone):
            assert cal.excludes(rule, wall) == _reference(reckoned, wall, zone), wall


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.dates(date(2026, 1, 1), date(2026, 6, 30)),
    st.integers(10, 20),  # the hour: never in a gap
    st.integers(1, 180),  # minutes long
    st.sampled_from(ZONES),
    st.sampled_from(ZONES),
    st.integers(2, 12),
    st.sets(st.integers(1, 11), max_size=4),
)
def test_a_weekly_series_with_exdates_excludes_each_kept_occurrence(
    first, hour, minutes, event_zone, zone_name, count, removed
) -> None:
    ez, zone = ZoneInfo(event_zone), ZoneInfo(zone_name)
    start = datetime.combine(first, time(hour, 5))
    length = timedelta(minutes=minutes)
    exdates = [start + timedelta(weeks=k) for k in sorted(removed) if k < count]
    lines = (
        f"DTSTART;TZID={event_zone}:{_stamp(start)}\r\n"
        f"DTEND;TZID={event_zone}:{_stamp(start + length)}\r\n"
        f"RRULE:FREQ=WEEKLY;COUNT={count}\r\n"
        + "".join(f"EXDATE;TZID={event_zone}:{_stamp(x)}\r\n" for x in exdates)
    )
    rule = _rule({"ical": {"text": _document([lines]), "timezone": zone_name}})
    kept = [
        (begin, begin + length)
        for k in range(count)
        if k not in removed
        for begin in [(start + timedelta(weeks=k)).replace(tzinfo=ez)]
    ]
    for k in range(count):
        begin = (start + timedelta(weeks=k)).replace(tzinfo=ez)
        for instant in (begin - timedelta(seconds=1), begin, begin + length / 2, begin + length):
            wall = instant.astimezone(zone).replace(tzinfo=None)
            if not _plain(wall, zone):
                continue
            expected = any(a <= instant < b for a, b in kept)
            assert cal.excludes(rule, wall) == expected, (k, wall)


# --- refused documents ------------------------------------------------------------------------


def _daily(n: int) -> str:
    """``n`` daily series of one minute each, from 09:00."""
    return _document(
        [
            f"DTSTART:2026010{1 + i % 9}T0900{i % 60:02d}\r\nDURATION:PT1M\r\n"
            "RRULE:FREQ=DAILY\r\n"
            for i in range(n)
        ]
    )


_TEXT = "definition.ical.text"


@pytest.mark.parametrize(
    ("definition", "field"),
    [
        ({"ical": "not a calendar"}, "definition.ical.text"),
        ({"ical": ""}, "definition.ical.text"),
        ({"ical": 3}, "definition.ical"),
        ({"ical": {"txt": "BEGIN:VCALENDAR"}}, "definition.ical"),
        ({"ical": "BEGIN:VEVENT\r\nDTSTART:20260101T000000\r\nEND:VEVENT\r\n"}, _TEXT),
        ({"ical": _document(["SUMMARY:no start\r\n"])}, "definition.ical.text"),
        ({"ical": {"text": _document([]), "timezone": "Mars/Olympus"}}, "definition.ical.timezone"),
        ({"ical": _document([]).replace("VERSION", "X-WR-TIMEZONE:Nowhere\r\nVERSION")},
         "definition.ical.text"),
        ({"ical": _document(["DTSTART:20260101T000000\r\nRRULE:FREQ=HOURLY\r\n"])},
         "definition.ical.text"),
        ({"ical": _document(["DTSTART:20260101T000000\r\nRRULE:FREQ=DAILY;BYHOUR=1,2\r\n"])},
         "definition.ical.text"),
        ({"ical": _daily(cal.MAX_ICAL_YEARLY // 366 + 1)}, "definition.ical.text"),
        ({"ical": "BEGIN:VCALENDAR\r\n" + "X" * cal.MAX_ICAL_CHARS}, "definition.ical.text"),
        ({"union": [{"weekdays": ["sun"]}, {"ical": "nonsense"}]}, "definition.union[1].ical.text"),
    ],
)
def test_a_bad_document_is_refused_on_a_named_field(definition, field) -> None:
    with pytest.raises(ScheduleError) as caught:
        cal.parse_calendar("t", definition)
    assert caught.value.field == field


def test_the_yearly_bound_admits_a_document_just_inside_it() -> None:
    n = (cal.MAX_ICAL_YEARLY - 1) // 367  # 366 a rule and one for its DTSTART
    rule = _rule({"ical": _daily(n)})
    assert cal.excludes(rule, datetime(2026, 5, 5, 9, 0, 0))


@given(st.text(max_size=200))
def test_any_text_is_a_rule_or_a_named_error(text: str) -> None:
    try:
        rule = _rule({"ical": text})
    except ScheduleError as exc:
        assert exc.field.startswith("definition.ical")
    else:
        rule.spans(date(2026, 1, 1))


def test_an_event_across_the_autumn_change_excludes_every_wall_time_it_covers() -> None:
    """Berlin, 2026-10-25: 03:00 summer time is 02:00 winter time at 01:00 UTC. An event from
    00:30 to 01:30 UTC covers 02:30-03:00 summer time, then 02:00-02:30 winter time: every wall
    time of the repeated hour, and one of 00:45 to 01:15 UTC all of 02:45-03:00 and 02:00-02:15."""
    one_hour = _document(["DTSTART:20261025T003000Z\r\nDTEND:20261025T013000Z\r\n"])
    rule = _rule({"ical": {"text": one_hour, "timezone": "Europe/Berlin"}})
    day = date(2026, 10, 25)
    assert rule.spans(day) == ((2 * 3600, 3 * 3600),)
    half = _document(["DTSTART:20261025T004500Z\r\nDTEND:20261025T011500Z\r\n"])
    rule = _rule({"ical": {"text": half, "timezone": "Europe/Berlin"}})
    assert rule.spans(day) == ((2 * 3600, 2 * 3600 + 900), (2 * 3600 + 2700, 3 * 3600))
    # across the spring change (02:00 winter time is 03:00 summer time): no gap in the span
    spring = _document(["DTSTART:20260329T003000Z\r\nDTEND:20260329T013000Z\r\n"])
    rule = _rule({"ical": {"text": spring, "timezone": "Europe/Berlin"}})
    assert rule.spans(date(2026, 3, 29)) == ((1 * 3600 + 1800, 3 * 3600 + 1800),)
