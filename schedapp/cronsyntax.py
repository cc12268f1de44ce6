"""The day forms people write in cron, checked field by field and spelled for croniter.

People reach for Quartz's forms: ``L`` (the month's last day), ``LW`` (its last weekday),
``15W`` (the weekday nearest the 15th), ``FRI#2`` (its second Friday), ``FRIL`` or ``5L`` (its
last Friday). croniter reads ``L``, ``15W`` and ``FRI#2`` as written, spells the last Friday
``L5`` (and reads ``FRIL`` or ``5L`` not at all), and has no ``LW``: its ``31W`` is that day,
since it caps a ``W`` day at the month's end and the weekday nearest the last day is the last
weekday. ``engine_expr`` hands croniter those spellings; everything that reads a cron
(croniter's walk in ``schedules``, the day bitmasks of ``cronmath``) reads it through
``engine_expr``, so each form has one meaning, croniter's. The stored expression keeps the
user's spelling but for what cron-descriptor (the admin's plain words) would misread
(``spelled``).

croniter refuses a misused form with "not acceptable" and no field; ``problems`` names the
field and says what the field takes instead. Pure: no croniter here, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_FULL_WEEKDAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
_WEEKDAY_NUMBER = {name: n for names in (_WEEKDAYS, _FULL_WEEKDAYS) for n, name in enumerate(names)}
_MONTHS = (
    "january february march april may june july august september october november december"
).split()
# Every name cron takes, longest first so that "friday" is not read as "fri" + "day".
_NAMES = re.compile(
    "|".join(sorted({*_WEEKDAY_NUMBER, *_MONTHS, *(m[:3] for m in _MONTHS)}, key=len)[::-1])
)
_DAY = rf"[0-9]+|{'|'.join(sorted(_WEEKDAY_NUMBER, key=len, reverse=True))}"
_NTH = re.compile(rf"^(?P<day>{_DAY})#(?P<n>[0-9]+)$")  # fri#2
_NTH_RANGE = re.compile(rf"^(?P<first>{_DAY})-(?P<last>{_DAY})#(?P<n>[0-9]+)$")  # mon-fri#2
_LAST_WEEKDAY = re.compile(rf"^(?:(?P<day>{_DAY})l|l(?P<after>{_DAY}))$")  # 5l, fril, l5
_NEAREST = re.compile(r"^(?:[0-9]+w|w[0-9]+|lw)$")  # 15w, w15, lw
_BEFORE_LAST = re.compile(r"^l-[0-9]+$")  # Quartz's L-3
_UP_TO_LAST = re.compile(r"^[0-9]+-l(?:/[0-9]+)?$")  # croniter's 15-L: the 15th to the end
_SPECIAL = frozenset("lw#")

DAY_OF_MONTH_TAKES = (
    "besides days it takes L (the last day), LW (the last weekday) and 15W (the weekday "
    "nearest the 15th)"
)
DAY_OF_WEEK_TAKES = (
    "besides weekdays it takes FRI#2 or 5#2 (the second Friday) and FRIL or 5L (the last Friday)"
)


def field_names(has_seconds: bool) -> tuple[str, ...]:
    """The fields of a 5- or 6-field cron, in order, as errors name them."""
    names = ("minute", "hour", "day of month", "month", "day of week")
    return ("second", *names) if has_seconds else names


def problems(parts: Sequence[str], has_seconds: bool) -> list[str]:
    """What is wrong with the special forms (``L``, ``W``, ``#``) of each field, each naming
    its field ("day of week field: '5#6': ..."); empty when croniter is left to judge.
    Ranges of values are not checked here (``schedules`` does)."""
    found = []
    for name, part in zip(field_names(has_seconds), parts, strict=True):
        items = part.lower().split(",")
        if name == "day of month":
            found += [f"day of month field: {p}" for p in _day_of_month(items)]
        elif name == "day of week":
            found += [f"day of week field: {p}" for p in _day_of_week(items)]
        else:
            for item in items:
                if _special(item):
                    found.append(
                        f"{name} field: {item.upper()!r}: L, W and # belong to the day of "
                        "month field (L, LW, 15W) and the day of week field (FRI#2, FRIL)"
                    )
                    break
    return found


def _special(item: str) -> bool:
    """Whether an item uses L, W or # (the letters of a name do not count)."""
    return bool(_SPECIAL & set(_NAMES.sub("", item)))


def _day_of_month(items: list[str]) -> list[str]:
    found = []
    for item in items:
        shown = repr(item.upper())
        if item == "l" or _UP_TO_LAST.match(item):
            continue
        if _NEAREST.match(item):
            if len(items) > 1:
                found.append(f"{shown} stands alone: a nearest-weekday day (W) cannot be in a list")
            continue
        if _BEFORE_LAST.match(item):
            found.append(f"{shown} (days before the last) is not supported; {DAY_OF_MONTH_TAKES}")
        elif "#" in item or _LAST_WEEKDAY.match(item):
            found.append(f"{shown} belongs to the day of week field; {DAY_OF_MONTH_TAKES}")
        elif _special(item):
            found.append(f"{shown} is not a day of month form; {DAY_OF_MONTH_TAKES}")
    return found


def _day_of_week(items: list[str]) -> list[str]:
    found = []
    for item in items:
        shown = repr(item.upper())
        nth = _NTH.match(item) or _NTH_RANGE.match(item)
        if nth:
            if not 1 <= int(nth["n"]) <= 5:
                found.append(
                    f"{shown}: #{nth['n']} does not exist, a month has one to five of each "
                    "weekday (#1 to #5; FRIL is the last Friday)"
                )
            elif "first" in nth.groupdict() and (nth["first"].isdigit() or nth["last"].isdigit()):
                found.append(f"{shown}: write a range of weekdays with '#' by name (MON-FRI#2)")
            continue
        if _LAST_WEEKDAY.match(item):
            continue
        if item == "l":
            found.append(
                f"{shown} alone has no agreed meaning (Quartz reads it as Saturday): write FRIL "
                "or 5L for the last Friday of the month, or L in the day of month field for "
                "its last day"
            )
        elif "w" in _NAMES.sub("", item):
            found.append(
                f"{shown}: W (the nearest weekday, LW the last one) belongs to the day of "
                f"month field; {DAY_OF_WEEK_TAKES}"
            )
        elif _special(item):
            found.append(f"{shown} is not a day of week form; {DAY_OF_WEEK_TAKES}")
    return found


def spelled(parts: list[str]) -> list[str]:
    """The day fields as cron-descriptor (the admin's plain words) reads them: the day of
    month upper case ("15w" would read as "on day 15w"; it holds no names), and a full weekday
    name next to L shortened ("fridayL" as "friL")."""
    parts = list(parts)
    dom, dow = len(parts) - 3, len(parts) - 1
    parts[dom] = parts[dom].upper()
    parts[dow] = ",".join(_short_last(item) for item in parts[dow].split(","))
    return parts


def _short_last(item: str) -> str:
    last = _LAST_WEEKDAY.match(item.lower())
    if last is None or (last["day"] or last["after"]) not in _FULL_WEEKDAYS:
        return item
    return item[:3] + item[-1] if last["day"] else item[:4]


def hint(name: str, part: str) -> str:
    """What to add to croniter's refusal of a field: croniter cannot list plain weekdays
    with ``#`` or ``L`` ones (``1,5#3``)."""
    items = part.lower().split(",")
    if name == "day of week" and any(map(_special, items)):
        if not all(map(_special, items)):
            return " (plain weekdays cannot be listed with FRI#2 or FRIL ones)"
    return ""


@lru_cache(maxsize=4096)
def engine_expr(expr: str) -> str:
    """``expr`` spelled as croniter reads it: ``LW`` as ``31W``, the last Friday (``FRIL``,
    ``5L``, ``LFRI``) as ``L5``; every other item as written. Only the day fields change."""
    parts = expr.split()
    if len(parts) not in (5, 6):
        return expr
    dom, dow = len(parts) - 3, len(parts) - 1
    parts[dom] = ",".join("31W" if i.lower() == "lw" else i for i in parts[dom].split(","))
    parts[dow] = ",".join(_croniter_weekday(i) for i in parts[dow].split(","))
    return " ".join(parts)


def _croniter_weekday(item: str) -> str:
    last = _LAST_WEEKDAY.match(item.lower())
    if not last:
        return item
    day = last["day"] or last["after"]
    return f"L{_WEEKDAY_NUMBER.get(day, day)}"
