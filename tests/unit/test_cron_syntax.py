"""The day forms people write in cron: ``L``, ``LW``, ``nW``, ``DAY#n`` and ``DAYL``.

The oracle is written here with ``calendar`` and ``datetime`` alone: which day of a month each
form names (the last weekday found by walking back from the month's last day, the nearest
weekday as the weekday of the month at the least distance), and which instants a wall time
fires at (the DST rules of ``docs/semantics.md``: a fixed hour once, at its first instant, or
when the spring-forward gap it falls in ends; a wildcard hour at every instant it has). The
schedule code under test reads croniter and counts by month bitmasks: nothing is shared.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp import cronsyntax, schedules
from schedapp.display import describe_cron
from schedapp.exceptions import ScheduleError
from schedapp.schedules import (
    count_fire_times,
    fire_times,
    next_fire_time,
    parse_cron,
    recent_fire_times,
)
from tests import ROOT, examples

EPSILON = timedelta(microseconds=1)
ZONES = (
    "UTC",
    "Europe/Paris",  # changes on the last Sunday of March and October: SUNL is that day
    "America/New_York",
    "Australia/Lord_Howe",  # half-hour changes
    "America/Santiago",  # changes at midnight: 00:xx is the gap
    "Asia/Kolkata",
)
SHORT = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
FULL = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")

# --- the oracle ------------------------------------------------------------------------------


def days_in(year: int, month: int) -> list[date]:
    return [date(year, month, d) for d in range(1, calendar.monthrange(year, month)[1] + 1)]


def is_weekday(day: date) -> bool:
    return day.weekday() < 5  # Monday to Friday


def cron_weekday(day: date) -> int:
    return (day.weekday() + 1) % 7  # cron's numbers: Sunday is 0 (and 7)


def last_day(year: int, month: int) -> date | None:
    return days_in(year, month)[-1]


def last_weekday(year: int, month: int) -> date | None:
    day = days_in(year, month)[-1]
    while not is_weekday(day):
        day -= timedelta(days=1)
    return day


def nearest_weekday(n: int) -> Callable[[int, int], date | None]:
    """The weekday of the month nearest the n-th (the month's last day when it has no n-th):
    never a tie, since a weekend day has a weekday at distance 1 on one side only."""

    def day(year: int, month: int) -> date | None:
        days = days_in(year, month)
        target = days[min(n, len(days)) - 1]
        return min((d for d in days if is_weekday(d)), key=lambda d: abs(d - target))

    return day


def nth_weekday(weekday: int, n: int) -> Callable[[int, int], date | None]:
    def day(year: int, month: int) -> date | None:
        found = [d for d in days_in(year, month) if cron_weekday(d) == weekday % 7]
        return found[n - 1] if n <= len(found) else None  # a fifth Friday is not in every month

    return day


def last_of_weekday(weekday: int) -> Callable[[int, int], date | None]:
    def day(year: int, month: int) -> date | None:
        return [d for d in days_in(year, month) if cron_weekday(d) == weekday % 7][-1]

    return day


def first_instant_after_gap(naive: datetime, tz: ZoneInfo) -> datetime:
    """The first instant whose wall time is past ``naive`` (a wall time the clocks skipped)."""
    readings = [naive.replace(tzinfo=tz, fold=f).astimezone(UTC) for f in (0, 1)]
    lo, hi = min(readings), max(readings)  # lo's wall time is before naive's, hi's after
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) // 2
        mid -= timedelta(microseconds=mid.microsecond)
        if mid.astimezone(tz).replace(tzinfo=None) > naive:
            hi = mid
        else:
            lo = mid
    return hi


def wall_instants(naive: datetime, tz: ZoneInfo, fixed_hour: bool) -> list[datetime]:
    """The instants a wall time fires at: every instant that reads as it (a wildcard hour),
    the first of them (a fixed hour), or the end of the gap it fell in (a fixed hour)."""
    found = sorted(
        {
            instant
            for fold in (0, 1)
            if (instant := naive.replace(tzinfo=tz, fold=fold).astimezone(UTC))
            .astimezone(tz)
            .replace(tzinfo=None)
            == naive
        }
    )
    if fixed_hour:
        return found[:1] or [first_instant_after_gap(naive, tz)]
    return found


# --- the forms -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    dom: str
    dow: str
    day: Callable[[int, int], date | None]  # the day the form names in a month, if any
    meaning: str


def _cased(text: str) -> st.SearchStrategy[str]:
    return st.sampled_from([text, text.upper(), text.lower(), text.capitalize()])


def _weekday_spelling(weekday: int) -> st.SearchStrategy[str]:
    """A weekday as cron takes it: 0-7 (7 is Sunday again), its short or its full name."""
    names = [SHORT[weekday % 7], FULL[weekday % 7]]
    return st.just(str(weekday)) | st.sampled_from(names).flatmap(_cased)


@st.composite
def forms(draw: st.DrawFn) -> Form:
    kind = draw(st.sampled_from(["L", "LW", "nW", "#", "DAYL", "croniter L"]))
    if kind == "L":
        return Form("L", "*", last_day, "the last day")
    if kind == "LW":
        return Form(draw(_cased("LW")), "*", last_weekday, "the last weekday")
    if kind == "nW":
        n = draw(st.sampled_from([1, 2, 28, 29, 30, 31]) | st.integers(1, 31))  # edges first
        spelled = draw(st.sampled_from([f"{n}W", f"W{n}", f"{n}w"]))
        return Form(spelled, "*", nearest_weekday(n), f"the weekday nearest the {n}th")
    weekday = draw(st.integers(0, 7))
    day = draw(_weekday_spelling(weekday))
    if kind == "#":
        n = draw(st.integers(1, 5))
        return Form("*", f"{day}#{n}", nth_weekday(weekday, n), f"weekday {weekday} #{n}")
    if kind == "DAYL":
        return Form("*", f"{day}{draw(_cased('L'))}", last_of_weekday(weekday), "last")
    number = draw(st.sampled_from([str(weekday), SHORT[weekday % 7]]))  # croniter's own L5
    return Form("*", f"L{number}", last_of_weekday(weekday), "last, croniter's spelling")


@dataclass(frozen=True)
class Case:
    expr: str
    zone: str
    form: Form
    months: frozenset[int]
    hour: int | None  # None: the hour field is "*"
    minute: int
    second: int
    first: tuple[int, int]  # (year, month) the window starts in
    span: int  # further months the window covers


@st.composite
def cases(draw: st.DrawFn) -> Case:
    form = draw(forms())
    zone = draw(st.sampled_from(ZONES))
    seconds_field = draw(st.booleans())
    hour = draw(st.none() | st.integers(0, 3) | st.integers(0, 23))
    minute = draw(st.sampled_from([0, 30, 45]) | st.integers(0, 59))
    second = draw(st.integers(0, 59)) if seconds_field else 0
    months = frozenset(range(1, 13))
    month_field = "*"
    if draw(st.integers(0, 3)) == 0:
        months = frozenset(draw(st.lists(st.integers(1, 12), min_size=1, max_size=4)))
        month_field = ",".join(map(str, sorted(months)))
    fields = [str(minute), "*" if hour is None else str(hour), form.dom, month_field, form.dow]
    if seconds_field:
        fields.insert(0, str(second))
    year = draw(st.integers(1971, 2199))
    span = draw(st.integers(0, 2 if hour is None else 14))
    first = (year, draw(st.integers(1, 12)))
    return Case(" ".join(fields), zone, form, months, hour, minute, second, first, span)


def month_after(year: int, month: int, k: int) -> tuple[int, int]:
    index = year * 12 + month - 1 + k
    return index // 12, index % 12 + 1


def expected_fires(case: Case, start: datetime, end: datetime) -> list[datetime]:
    """Every fire in [start, end], from the oracle: the form's day of each month, each wall
    time of it, each wall time's instants."""
    tz = ZoneInfo(case.zone)
    found: set[datetime] = set()
    for k in range(-1, case.span + 2):
        year, month = month_after(*case.first, k)
        if month not in case.months:
            continue
        day = case.form.day(year, month)
        if day is None:
            continue
        for hour in range(24) if case.hour is None else (case.hour,):
            naive = datetime(day.year, day.month, day.day, hour, case.minute, case.second)
            found.update(wall_instants(naive, tz, fixed_hour=case.hour is not None))
    return sorted(t for t in found if start <= t <= end)


PROPERTY = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY
@given(case=cases(), data=st.data())
def test_property_each_form_fires_on_the_days_and_instants_computed_independently(case, data):
    """5- and 6-field forms, in zones with DST changes, over windows of up to 15 months:
    next-fire-time, counting and the last fire times all equal the oracle's list."""
    try:
        cron = parse_cron(case.expr, case.zone)
    except ScheduleError as exc:  # a cron must fire within 8 years (from 2001): FEB MON#5
        assert "never fires" in exc.message
        assert not any(
            case.form.day(year, month) for year in range(2001, 2009) for month in case.months
        ), case.expr
        return
    year, month = case.first
    last_year, last_month = month_after(year, month, case.span)
    start = datetime(year, month, 1, tzinfo=UTC) + data.draw(st.integers(-3 * 86400, 3 * 86400)) * (
        timedelta(seconds=1)
    )
    end = datetime(last_year, last_month, 28, tzinfo=UTC) + data.draw(
        st.integers(0, 7 * 86400)
    ) * timedelta(seconds=1)
    expected = expected_fires(case, start, end)
    where = f"{case.expr!r} in {case.zone} over [{start}, {end}]"

    assert list(fire_times(cron, start - EPSILON, end)) == expected, where
    assert count_fire_times(cron, start, end) == len(expected), where
    count = data.draw(st.integers(1, 20))
    assert recent_fire_times(cron, end, start, count) == expected[-count:], where
    after = start + data.draw(st.floats(0, 1)) * (end - start)
    later = [t for t in expected if t > after]
    if later:
        assert next_fire_time(cron, after) == later[0], where

    tz = ZoneInfo(case.zone)
    for fire in expected:  # a fire time always falls on the form's day, at its time or gap end
        local = fire.astimezone(tz)
        assert case.form.day(local.year, local.month) == local.date(), where
        assert local.month in case.months
        wall = local.replace(tzinfo=None)
        written = wall.replace(hour=case.hour if case.hour is not None else wall.hour)
        written = written.replace(minute=case.minute, second=case.second)
        if wall != written:  # only a fixed hour the clocks skipped fires at another time
            assert case.hour is not None
            assert (
                written.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None)
                != written
            ), where


def documented_rows() -> list[tuple[str, list[str]]]:
    """(example, next fires) of each row of docs/semantics.md's "Cron syntax" table."""
    text = (ROOT / "docs" / "semantics.md").read_text()
    section = text.split("### Cron syntax", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[3].startswith("`"):
            rows.append((cells[3].strip("`"), cells[4].split(", ")))
    return rows


def test_the_documented_table_has_every_form():
    examples_ = " ".join(example for example, _ in documented_rows())
    for form in (" L ", " LW ", "15W", "FRI#2", "FRIL", "30 0 9 * * 5L"):
        assert form in examples_, form


@pytest.mark.parametrize(("expr", "fires"), documented_rows())
def test_each_documented_example_fires_as_the_table_says(expr, fires):
    cron = parse_cron(expr, "UTC")
    got = fire_times(cron, datetime(2026, 1, 1, tzinfo=UTC), limit=len(fires))
    shown = [t.strftime("%m-%d %H:%M") + (f":{t.second:02}" if t.second else "") for t in got]
    assert shown == fires


@pytest.mark.parametrize(
    ("expr", "zone", "after", "firsts"),
    [
        # Paris changes its clocks on the last Sunday: 02:30 is skipped in March (it runs when
        # the gap ends, 03:00+02:00) and repeated in October (it runs once, in summer time).
        (
            "30 2 * * SUNL",
            "Europe/Paris",
            "2026-03-01",
            ["2026-03-29T03:00+02:00", "2026-04-26T02:30+02:00"],
        ),
        ("30 2 * * 0L", "Europe/Paris", "2026-10-01", ["2026-10-25T02:30+02:00"]),
        ("0 30 2 * * 7L", "Europe/Paris", "2026-10-01", ["2026-10-25T02:30+02:00"]),
        # New York's is the second Sunday of March: SUN#2.
        ("30 2 * * SUN#2", "America/New_York", "2026-03-01", ["2026-03-08T03:00-04:00"]),
        # Wildcard hour: elapsed time, both passes of the repeated hour.
        (
            "30 * * * SUNL",
            "Europe/Paris",
            "2026-10-25T01:00",
            ["2026-10-25T01:30+02:00", "2026-10-25T02:30+02:00", "2026-10-25T02:30+01:00"],
        ),
        # Spellings of the same days.
        ("30 0 9 * * fridayL", "UTC", "2026-03-01", ["2026-03-27T09:00:30+00:00"]),
        ("0 9 * * LFRI", "UTC", "2026-03-01", ["2026-03-27T09:00+00:00"]),
        ("0 9 lw * *", "UTC", "2026-05-01", ["2026-05-29T09:00+00:00"]),
    ],
)
def test_given_a_form_on_a_dst_day_when_computing_next_fires_then_the_dst_rules_apply(
    expr, zone, after, firsts
):
    cron = parse_cron(expr, zone)
    start = datetime.fromisoformat(after).replace(tzinfo=ZoneInfo(zone))
    got = list(fire_times(cron, start, limit=len(firsts)))
    assert got == [datetime.fromisoformat(t) for t in firsts]
    end = got[-1]
    assert count_fire_times(cron, start, end) == len(firsts)
    assert recent_fire_times(cron, end, start, len(firsts)) == got


# --- what each field refuses, named ----------------------------------------------------------

NOT_IN_OTHER_FIELDS = ["L", "LW", "15W", "W", "5#2", "FRI#2", "5L", "FRIL", "L5", "L-2"]
NOT_IN_DAY_OF_MONTH = ["5#2", "FRI#2", "5L", "FRIL", "L5", "L-2", "W", "LW,1", "1,15W", "L1W"]
NOT_IN_DAY_OF_WEEK = [
    "LW", "15W", "W", "L", "5#6", "5#0", "FRI#9", "L-2", "1-5#2", "FRI#L", "1,5#3", "5LW",
]  # fmt: skip
OUT_OF_RANGE = [
    ("day of month", "32W", "day of month 32 is out of range (1-31)"),
    ("day of month", "W0", "day of month 0 is out of range (1-31)"),
    ("day of week", "8L", "day of week 8 is out of range (0-7)"),
    ("day of week", "L9", "day of week 9 is out of range (0-7)"),
    ("day of week", "8#2", "day of week 8 is out of range (0-7)"),
]


@settings(max_examples=examples(300), deadline=None)
@given(seconds_field=st.booleans(), data=st.data())
def test_property_a_misused_form_is_refused_naming_its_field(seconds_field, data):
    """Every special form in a field that does not take it, in 5- and 6-field crons, is
    refused with an error keyed ``cron`` whose message names the field."""
    names = cronsyntax.field_names(seconds_field)
    position = data.draw(st.integers(0, len(names) - 1), label="position")
    name = names[position]
    bad = {"day of month": NOT_IN_DAY_OF_MONTH, "day of week": NOT_IN_DAY_OF_WEEK}.get(
        name, NOT_IN_OTHER_FIELDS
    )
    token = data.draw(st.sampled_from(bad).flatmap(_cased), label="token")
    parts = ["*"] * len(names)
    parts[position] = token
    expr = " ".join(parts)
    with pytest.raises(ScheduleError) as info:
        parse_cron(expr, "UTC")
    assert info.value.field == "cron"
    assert f"{name} field: " in info.value.message, (expr, info.value.message)
    assert str(info.value).startswith("cron: "), str(info.value)


@pytest.mark.parametrize(("name", "token", "says"), OUT_OF_RANGE)
@pytest.mark.parametrize("seconds_field", [False, True])
def test_given_a_form_out_of_range_when_parsing_then_the_error_names_the_field(
    name, token, says, seconds_field
):
    fields = ["0", "9", "*", "*", "*"]
    fields[2 if name == "day of month" else 4] = token
    expr = " ".join(["0", *fields] if seconds_field else fields)
    with pytest.raises(ScheduleError, match=r"^cron: ") as info:
        parse_cron(expr, "UTC")
    assert says in info.value.message, info.value.message


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("0 9 * * 5#6", "day of week field: '5#6': #6 does not exist"),
        ("0 9 * * LW", "day of week field: 'LW': W (the nearest weekday, LW the last one) belongs"),
        ("0 9 * * L", "day of week field: 'L' alone has no agreed meaning"),
        ("0 9 * L *", "month field: 'L': L, W and # belong to the day of month field"),
        ("0 9 LW,15 * *", "day of month field: 'LW' stands alone"),
        ("0 9 L-2 * *", "day of month field: 'L-2' (days before the last) is not supported"),
        ("0 9 * * 1,5#3", "day of week field: '1,5#3' is not valid (plain weekdays cannot"),
        ("0 9 * * MOX", "day of week field: 'MOX' is not valid"),
        ("0 0 9 * * FRI#L", "day of week field: 'FRI#L' is not a day of week form"),
    ],
)
def test_given_a_misused_form_when_parsing_then_the_message_says_what_the_field_takes(expr, says):
    with pytest.raises(ScheduleError) as info:
        parse_cron(expr, "UTC")
    assert says in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("expr", "engine"),
    [
        ("0 9 LW * *", "0 9 31W * *"),
        ("0 0 9 lw * *", "0 0 9 31W * *"),
        ("0 9 * * 5L", "0 9 * * L5"),
        ("0 9 * * FRIL,mon#1", "0 9 * * L5,mon#1"),
        ("0 9 * * fridayl", "0 9 * * L5"),
        ("0 9 * * LSun", "0 9 * * L0"),
        ("0 9 L * L5", "0 9 L * L5"),
        ("0 9 15W * FRI#2", "0 9 15W * FRI#2"),
        ("0 L 9 * * *", "0 L 9 * * *"),  # only the day fields are spelled anew
    ],
)
def test_given_quartz_spellings_when_handed_to_croniter_then_they_are_croniters(expr, engine):
    assert cronsyntax.engine_expr(expr) == engine


@pytest.mark.parametrize(
    ("written", "stored", "words"),
    [
        ("0 9 LW * *", "0 9 LW * *", "on the last weekday of the month"),
        ("0 0 9 lw * *", "0 0 9 LW * *", "on the last weekday of the month"),
        ("0 9 l * *", "0 9 L * *", "on the last day of the month"),
        ("0 9 15w * *", "0 9 15W * *", "on the weekday nearest day 15 of the month"),
        ("0 9 * * friday#2", "0 9 * * fri#2", "on the second Friday of the month"),
        ("0 9 * * FRIL", "0 9 * * FRIL", "on the last Friday of the month"),
        ("0 9 * * fridayL", "0 9 * * friL", "on the last Friday of the month"),
        ("0 9 * * 5L", "0 9 * * 5L", "on the last Friday of the month"),
        ("0 9 * * LFRI", "0 9 * * LFRI", "on the last Friday of the month"),
    ],
)
def test_the_stored_expression_is_the_users_spelling_as_the_admin_words_read_it(
    written, stored, words
):
    """Stored as written but for the day of month's case and a full name before L, which
    cron-descriptor (the admin's plain words) would misread: "15w" as "on day 15w"."""
    assert parse_cron(written, "UTC").expr == stored
    assert words in describe_cron(stored)


EVERY_MONTH_SHAPE = (datetime(2001, 1, 1, tzinfo=UTC), datetime(2028, 12, 31, 23, tzinfo=UTC))
EVERY_FORM = [
    ("L", "*", last_day),
    ("LW", "*", last_weekday),
    *((f"{n}W", "*", nearest_weekday(n)) for n in range(1, 32)),
    *(("*", f"{w}#{n}", nth_weekday(w, n)) for w in range(8) for n in range(1, 6)),
    *(("*", f"{w}L", last_of_weekday(w)) for w in range(8)),
]


def every_month_shape(day: Callable[[int, int], date | None]) -> list[datetime]:
    return [
        datetime(d.year, d.month, d.day, 12, tzinfo=UTC)
        for year in range(2001, 2029)
        for month in range(1, 13)
        if (d := day(year, month)) is not None
    ]


@pytest.mark.parametrize(("dom", "dow", "day"), EVERY_FORM, ids=lambda v: getattr(v, "__name__", v))
def test_given_every_form_over_every_month_shape_then_its_days_are_the_oracles(dom, dow, day):
    """2001 to 2028 hold every month length starting on every weekday (Februaries of 29 days
    included): each form's days, counted and walked back by cronmath, are the oracle's."""
    cron = parse_cron(f"0 12 {dom} * {dow}", "UTC")
    start, end = EVERY_MONTH_SHAPE
    expected = every_month_shape(day)
    assert count_fire_times(cron, start, end) == len(expected)
    assert recent_fire_times(cron, end, start, len(expected)) == expected


@pytest.mark.exhaustive
@pytest.mark.parametrize(("dom", "dow", "day"), EVERY_FORM, ids=lambda v: getattr(v, "__name__", v))
def test_given_every_form_over_every_month_shape_then_croniters_walk_finds_the_oracles(
    dom, dow, day
):
    """The same days, one next fire at a time (croniter's walk: 8 s for every form, so under
    the exhaustive marker; the property above covers the walk over random windows)."""
    cron = parse_cron(f"0 12 {dom} * {dow}", "UTC")
    start, end = EVERY_MONTH_SHAPE
    assert list(fire_times(cron, start, end)) == every_month_shape(day)


TOKENS = st.sampled_from(
    """* ? 0 5 15 31 1-5 */2 L l LW lw 15W W15 5L FRIL fridayL L5 LFRI 5#2 FRI#2 mon-fri#2 5#6
    L-2 W # 1,L L,LW 5L,1#1 1,5#3 jan JUL-AUG wed 8L 32W 0W LL""".split()
)


@settings(max_examples=examples(300), deadline=None)
@given(fields=st.lists(TOKENS, min_size=5, max_size=6), day_or=st.booleans())
def test_property_any_mix_of_day_forms_parses_or_names_a_field(fields, day_or):
    """Whatever the day forms and wherever they stand: a schedule whose next fire is on its
    form's terms, or a ScheduleError keyed ``cron`` that names a field or says it never fires."""
    expr = " ".join(fields)
    try:
        cron = parse_cron(expr, "Europe/Paris", day_or=day_or)
    except ScheduleError as exc:
        assert exc.field == "cron"
        named = [f"{name} " for name in cronsyntax.field_names(len(fields) == 6)]
        assert any(n in exc.message for n in named) or "never fires" in exc.message, exc.message
        return
    start = datetime(2026, 1, 1, tzinfo=UTC)
    first = next_fire_time(cron, start)
    assert first is not None
    assert count_fire_times(cron, start + EPSILON, first) == 1


def test_the_fields_are_named_as_the_range_errors_name_them():
    ranges = (schedules._SECOND_FIELD, *schedules._CRON_FIELDS)
    assert cronsyntax.field_names(True) == tuple(name for name, _, _ in ranges)
    assert cronsyntax.field_names(False) == cronsyntax.field_names(True)[1:]
