"""A job's DST policy (``dst_policy``): the gap and fold rules of a fixed-hour cron, and the
``celery`` preset (its differential against Celery itself is in test_celery_differential.py).

The oracle for the gap and fold policies is ``reference``: every matching wall time in a window,
by croniter over naive times, read with zoneinfo's two folds and the rule applied wall time by
wall time. It shares nothing with ``cronmath`` (no offset pieces, no bitmasks, no bisection), so
next (``fire_times``), count and recent, which do, are checked against an independent path; and
count and recent against ``fire_times`` under every policy, ``celery`` included.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp.cronmath import DEFAULT_DST_POLICY, DST_POLICIES
from schedapp.exceptions import ScheduleError
from schedapp.schedules import (
    count_fire_times,
    fire_times,
    parse_cron,
    parse_dst_policy,
    recent_fire_times,
)
from tests import examples

EPSILON = timedelta(microseconds=1)
MINUTE = timedelta(minutes=1)
ZONES = ("Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham")
# 2026's offset changes of each zone (UTC), found once by walking the year hour by hour.
_CHANGES: dict[str, list[datetime]] = {}
FIXED_HOURS = ("1", "2", "3", "1,2", "2-3", "*/2", "0-4", "2,14")
MINUTES = ("0", "30", "45", "*/15", "0,45", "10-40/10", "59", "*")
NON_CELERY = tuple(p for p in DST_POLICIES if p != "celery")


def changes(zone: str) -> list[datetime]:
    if zone not in _CHANGES:
        tz, found = ZoneInfo(zone), []
        t = datetime(2026, 1, 1, tzinfo=UTC)
        while t.year == 2026:
            if (t + timedelta(hours=1)).astimezone(tz).utcoffset() != t.astimezone(tz).utcoffset():
                lo = t
                while (lo + MINUTE).astimezone(tz).utcoffset() == t.astimezone(tz).utcoffset():
                    lo += MINUTE
                found.append(lo + MINUTE)
            t += timedelta(hours=1)
        _CHANGES[zone] = found
    return _CHANGES[zone]


def reference(expr: str, zone: str, policy: str, start: datetime, end: datetime) -> list[datetime]:
    """The fires in (start, end] of a cron under a gap+fold policy, wall time by wall time."""
    tz = ZoneInfo(zone)
    gap, fold = policy.split("+")
    wildcard = expr.split()[1] == "*"
    if wildcard:  # elapsed time under every policy but celery's
        gap, fold = "skip", "both"
    first_wall = (start - timedelta(days=1)).astimezone(tz).replace(tzinfo=None)
    last_wall = (end + timedelta(days=1)).astimezone(tz).replace(tzinfo=None)
    it = croniter(expr, first_wall)
    fires: set[datetime] = set()
    while (wall := it.get_next(datetime)) <= last_wall:
        readings = sorted(
            {
                t
                for f in (0, 1)
                if (t := wall.replace(tzinfo=tz, fold=f).astimezone(UTC))
                .astimezone(tz)
                .replace(tzinfo=None)
                == wall
            }
        )
        if len(readings) == 2:
            chosen = {"first": readings[:1], "second": readings[1:], "both": readings}[fold]
        elif readings:
            chosen = readings
        elif gap == "gap_end":  # the first instant whose wall time is past this one
            t = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
            while t.astimezone(tz).replace(tzinfo=None) < wall:
                t += MINUTE
            chosen = [t]
        else:
            chosen = []
        fires.update(t for t in chosen if start < t <= end)
    return sorted(fires)


def cron_exprs(*, wildcard: bool = True, zone: str | None = None) -> st.SearchStrategy[str]:
    """Daily crons; for ``zone``, half of them name the hours its 2026 changes skip or repeat."""
    choices = (*FIXED_HOURS, "*") if wildcard else FIXED_HOURS
    hours = st.sampled_from(choices)
    if zone is not None:
        tz = ZoneInfo(zone)
        near = sorted(
            {str((c + d).astimezone(tz).hour) for c in changes(zone) for d in (-EPSILON, EPSILON)}
        )
        hours = st.one_of(hours, st.sampled_from(near), st.just(",".join(near)))
    return st.builds(lambda m, h: f"{m} {h} * * *", st.sampled_from(MINUTES), hours)


@st.composite
def windows(draw: st.DrawFn) -> tuple[str, datetime, datetime]:
    """A zone and a window of up to three days around one of its 2026 offset changes."""
    zone = draw(st.sampled_from(ZONES))
    change = draw(st.sampled_from(changes(zone)))
    # Mostly a window holding the change, starting shortly before it (the repeated or skipped
    # wall times and the piece before them inside) and ending shortly after it or a day later;
    # else one that may end before the change or start after it.
    hour = 3600
    before = (1, 1800, hour, hour + 60, 2 * hour, 3 * hour, 26 * hour)
    after = (0, 1, 1800, hour, 2 * hour, 86400)
    if draw(st.integers(0, 4)):
        start = change - timedelta(
            seconds=draw(st.one_of(st.sampled_from(before), st.integers(0, 2 * 86400)))
        )
        end = change + timedelta(
            seconds=draw(st.one_of(st.sampled_from(after), st.integers(0, 86400)))
        )
    else:
        start = change + timedelta(seconds=draw(st.integers(-2 * 86400, 86400)))
        end = start + timedelta(seconds=draw(st.integers(60, 3 * 86400)))
    return zone, start, end


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, datetime, datetime]:
    """A cron, a zone and a window around one of the zone's changes."""
    zone, start, end = draw(windows())
    return draw(cron_exprs(zone=zone)), zone, start, end


def listed(expr: str, zone: str, policy: str, start: datetime, end: datetime) -> list[datetime]:
    return list(fire_times(parse_cron(expr, zone, dst_policy=policy), start, until=end))


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(cases(), st.sampled_from(NON_CELERY))
def test_fire_times_follow_the_policy_wall_time_by_wall_time(case, policy):
    expr, zone, start, end = case
    assert listed(expr, zone, policy, start, end) == reference(expr, zone, policy, start, end)


@settings(max_examples=examples(300), deadline=None)
@given(cases(), st.sampled_from((*DST_POLICIES, "celery", "celery")), st.integers(1, 200))
def test_counts_and_the_last_occurrences_equal_the_listed_fire_times(case, policy, n):
    """count_fire_times and recent_fire_times (the misfire policies' arithmetic) agree with
    the fire times listed one by one, under every policy: the claim never sees another rule."""
    expr, zone, start, end = case
    cron = parse_cron(expr, zone, dst_policy=policy)
    fires = list(fire_times(cron, start - EPSILON, until=end))
    assert count_fire_times(cron, start, end) == len(fires)
    assert recent_fire_times(cron, end, start, n) == fires[-n:]


@settings(max_examples=examples(200), deadline=None)
@given(
    cron_exprs(wildcard=False),
    st.sampled_from(("skip+first", "skip+second", "skip+both")),
    st.sampled_from(ZONES),
)
def test_a_skipped_gap_never_fires_inside_nor_at_its_end_for_its_own_times(expr, policy, zone):
    """Under ``skip``, every fire on a spring-forward day is a wall time the cron names: none
    is moved to the gap's end (02:30 does not run at 03:00), none happens in the gap."""
    tz = ZoneInfo(zone)
    for change in changes(zone):
        before = (change - EPSILON).astimezone(tz).utcoffset()
        if before >= change.astimezone(tz).utcoffset():
            continue  # a fall-back change
        fires = listed(expr, zone, policy, change - timedelta(days=1), change + timedelta(days=1))
        for fire in fires:
            wall = fire.astimezone(tz).replace(tzinfo=None)
            assert croniter.match(expr, wall), (fire, wall)
        moved = listed(expr, zone, "gap_end" + policy[4:], change - timedelta(days=1), change)
        assert set(fires) >= set(moved) - {change}  # only the gap's end is taken away


@settings(max_examples=examples(200), deadline=None)
@given(
    cron_exprs(wildcard=False),
    st.sampled_from(("first", "second", "both")),
    st.sampled_from(("gap_end", "skip")),
    st.sampled_from(ZONES),
)
def test_a_repeated_wall_time_fires_at_the_offsets_the_fold_names(expr, fold, gap, zone):
    tz = ZoneInfo(zone)
    for change in changes(zone):
        if (change - EPSILON).astimezone(tz).utcoffset() <= change.astimezone(tz).utcoffset():
            continue  # a spring-forward change
        window = (change - timedelta(hours=3), change + timedelta(hours=3))
        fires = set(listed(expr, zone, f"{gap}+{fold}", *window))
        repeated = 0
        for fire in fires:
            local = fire.astimezone(tz)
            other = local.replace(fold=1 - local.fold).astimezone(UTC)
            if other == fire:
                continue  # a wall time that happens once
            repeated += 1
            first, second = sorted((fire, other))
            if fold == "both":
                assert {first, second} <= fires
            else:
                assert fire == (first if fold == "first" else second)
                assert (second if fold == "first" else first) not in fires
        if croniter.match(expr, (change - MINUTE).astimezone(tz).replace(tzinfo=None)):
            assert repeated  # the last minute of the first pass is repeated, and named


# --- the cases by hand ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "zone", "day", "policy", "expected"),
    [
        ("30 2 * * *", "Europe/Paris", "2026-03-29", "gap_end+first", ["03:00+02:00"]),
        ("30 2 * * *", "Europe/Paris", "2026-03-29", "skip+first", []),
        ("30 2 * * *", "Europe/Paris", "2026-03-29", "celery", ["03:30+02:00"]),
        ("30 2 * * *", "Europe/Paris", "2026-10-25", "gap_end+first", ["02:30+02:00"]),
        ("30 2 * * *", "Europe/Paris", "2026-10-25", "skip+second", ["02:30+01:00"]),
        (
            "30 2 * * *",
            "Europe/Paris",
            "2026-10-25",
            "gap_end+both",
            ["02:30+02:00", "02:30+01:00"],
        ),
        ("30 2 * * *", "Europe/Paris", "2026-10-25", "celery", ["02:30+02:00"]),
        ("30 1 * * *", "America/New_York", "2026-11-01", "skip+second", ["01:30-05:00"]),
        ("30 1 * * *", "America/New_York", "2026-11-01", "celery", ["01:30-04:00"]),
        ("0,30 2 * * *", "America/New_York", "2026-03-08", "gap_end+first", ["03:00-04:00"]),
        ("0,30 2 * * *", "America/New_York", "2026-03-08", "celery", ["03:00-04:00"]),
        (
            "*/30 * * * *",
            "Europe/Paris",
            "2026-10-25",
            "skip+first",
            ["02:00+02:00", "02:30+02:00", "02:00+01:00", "02:30+01:00"],
        ),
        ("*/30 * * * *", "Europe/Paris", "2026-10-25", "celery", ["02:00+02:00", "02:30+02:00"]),
        # a half-hour gap (02:00-02:30): Celery sends 02:10 at 02:40 and steps from there, so
        # 02:30, a wall time after the gap but before that send, does not fire
        ("10-40/10 2 * * *", "Australia/Lord_Howe", "2026-10-04", "celery", ["02:40+11:00"]),
        ("10-40/10 2 * * *", "Australia/Lord_Howe", "2026-10-04", "gap_end+first", ["02:30+11:00", "02:40+11:00"]),  # noqa: E501
    ],
)
def test_the_policies_on_the_2026_changes(expr, zone, day, policy, expected):
    tz = ZoneInfo(zone)
    start = datetime.fromisoformat(day).replace(hour=1, minute=59, tzinfo=tz)
    end = datetime.fromisoformat(day).replace(hour=3, minute=59, tzinfo=tz)
    if expr.startswith("30 1") or expr.startswith("*/30"):
        start, end = start.replace(hour=0), end.replace(hour=2, minute=59, fold=1)
    every = listed(expr, zone, policy, start, end)
    cron = parse_cron(expr, zone, dst_policy=policy)
    assert count_fire_times(cron, start + EPSILON, end) == len(every)
    assert recent_fire_times(cron, end, start + EPSILON, 50) == every
    fires = [t.astimezone(tz) for t in every]
    shown = [f"{t:%H:%M}{t:%z}"[:-2] + ":" + f"{t:%z}"[-2:] for t in fires]
    hours = {e[:2] for e in expected} or {"02", "03"}  # the hours around the change
    assert [s for s in shown if s[:2] in hours] == expected


def test_a_bad_policy_is_refused_naming_the_field():
    for bad in ("gap_end", "first", "celery+first", "skip+third", 3, ["celery"]):
        with pytest.raises(ScheduleError) as caught:
            parse_dst_policy(bad)
        assert caught.value.field == "dst_policy"
        assert "gap_end+first" in caught.value.message
    assert parse_dst_policy(None) == parse_dst_policy("") == DEFAULT_DST_POLICY
    assert parse_dst_policy(" Celery ") == "celery"
