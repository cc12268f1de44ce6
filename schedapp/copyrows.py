"""Validated jobs as rows of PostgreSQL's ``COPY ... FROM STDIN``, in text or binary format.

Bulk scheduling writes every column of a new job itself (``COPY`` applies no Django
defaults). What jobs share (task, zone, schedule, options, source, fire times, the constant
columns) is encoded once and reused, so a row costs little more than its name and payload.
Values are encoded as the ORM would send them: the payload is the JSON text validation
measured; a timedelta keeps its days as days (as psycopg sends it), a time is UTC.

Binary is the default (``bulk.COPY_FORMAT``): PostgreSQL parses it for less work per row than
text, which is where most of a bulk load's time goes (``bench/README.md``).
"""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, time, timedelta
from typing import Any

from .calendars import DEFAULT_MODE, DEFAULT_ROLL
from .fields import CELERY_FIELDS, DEADLINE_FIELDS
from .option_rules import Options
from .schedules import DEFAULT_DST_POLICY, Once
from .validation import Checked

# Every column a new job has, in the order the encoders write them.
COPY_COLUMNS = (
    "name",
    "task",
    "args",
    "kwargs",
    "run_at",
    "cron",
    "timezone",
    "interval",
    "interval_anchor",
    "queue",
    "priority",
    "max_retries",
    "jitter",
    "lease_seconds",
    "misfire_max_catchup",
    "retry_backoff",
    "retry_backoff_max",
    "misfire_grace",
    "misfire_policy",
    "when_retries_exhausted",
    "catchup_window",
    "overlap",
    "max_buffer",
    "fixed_delay",
    "max_concurrent",
    *DEADLINE_FIELDS,
    "source",
    "next_run_at",
    "scheduled_for",
    "state",
    "retry_count",
    "missed_runs",
    "claimed_by",
    "lease_expires_at",
    "token",
    "last_run_at",
    "last_status",
    "last_error",
    "created_at",
    "updated_at",
    # Celery's semantics (migration 0007): shared by most jobs, encoded once per combination.
    *CELERY_FIELDS,
    "description",  # free text: its own encoding, per job
    "tags",  # a JSON list, shared by many jobs: encoded once per distinct list
    # A calendar (migration 0029): encoded once per (calendar, mode, roll).
    "calendar_id",
    "calendar_mode",
    "calendar_roll",
    "notify",  # likewise (channel names)
)
_EXTRA_FIELDS = CELERY_FIELDS
_MEMO_LIMIT = 4096


class _Memo(dict[Any, Any]):
    """A memo that starts again when full: a stream of distinct values holds few of them."""

    def put(self, key: Any, value: Any) -> Any:
        if len(self) >= _MEMO_LIMIT:
            self.clear()
        self[key] = value
        return value


class CopyRows:
    """How one validated job becomes one row (subclasses: the text and binary formats)."""

    format = ""
    header: Any = b""  # before the first row of each COPY
    trailer: Any = b""  # after the last

    def __init__(self, now: datetime) -> None:
        self._tasks = _Memo()
        self._zones = _Memo()
        self._times = _Memo()
        self._schedules = _Memo()
        self._options = _Memo()
        self._extras = _Memo()
        self._tags = _Memo()
        self._calendars = _Memo()

    def _calendar_of(self, values: dict[str, Any]) -> Any:
        calendar = values.get("calendar")
        key = (
            None if calendar is None else calendar.pk,
            values.get("calendar_mode") or DEFAULT_MODE,
            values.get("calendar_roll") or DEFAULT_ROLL,
        )
        encoded = self._calendars.get(key)
        if encoded is None:
            encoded = self._calendars.put(key, self._encode_calendar(*key))
        return encoded

    def _encode_calendar(self, calendar_id: int | None, mode: str, roll: str) -> Any:
        raise NotImplementedError

    def _tags_of(self, values: dict[str, Any], field: str = "tags") -> Any:
        key = (field, *(values.get(field) or ()))
        encoded = self._tags.get(key)
        if encoded is None:
            encoded = self._tags.put(key, self._encode_tags(json.dumps(list(key[1:]))))
        return encoded

    def _encode_tags(self, tags_json: str) -> Any:
        raise NotImplementedError

    def _extras_of(self, values: dict[str, Any]) -> Any:
        options = values.get("message_options")  # most jobs have none: no encoding then
        options_json = json.dumps(options, sort_keys=True) if options else "{}"
        key = (*map(values.get, _EXTRA_FIELDS[:-1]), options_json)
        encoded = self._extras.get(key)
        if encoded is None:
            encoded = self._extras.put(key, self._encode_extras(values, key[-1]))
        return encoded

    def _encode_extras(self, values: dict[str, Any], options_json: str) -> Any:
        raise NotImplementedError

    def join(self, rows: list[Any]) -> Any:
        raise NotImplementedError

    def encode(self, checked: Checked, source: str, first: datetime, due: datetime) -> Any:
        """The row of a valid job, first due at ``due`` for its occurrence ``first``."""
        raise NotImplementedError

    def _options_of(self, options: Options | None) -> Any:
        # Validation hands out one Options object per distinct combination: keyed by its
        # identity (held here too, so the id cannot be reused while it is a key).
        assert options is not None
        entry = self._options.get(id(options))
        if entry is None or entry[0] is not options:
            entry = self._options.put(id(options), (options, self._encode_options(options)))
        return entry[1]

    def _encode_options(self, options: Options) -> Any:
        raise NotImplementedError


# --- text ------------------------------------------------------------------------------------

_NULL = "\\N"


def _text(value: str) -> str:
    """A string as a field of COPY's text format: names, queues, cron and zone names hold no
    control characters (validated) and JSON escapes its own, so only backslashes remain."""
    return value.replace("\\", "\\\\") if "\\" in value else value


_TEXT_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _free_text(value: str) -> str:
    """Any text (a description: tabs, line breaks) as a field of COPY's text format."""
    return value.translate(_TEXT_ESCAPES) if value else ""


def _interval_text(value: timedelta) -> str:
    return str(value).replace(",", "")  # psycopg's text form: "1 day 0:00:03"


def _optional_interval_text(value: timedelta | None) -> str:
    return _NULL if value is None else _interval_text(value)


class TextRows(CopyRows):
    format = "text"
    header = trailer = ""

    def __init__(self, now: datetime) -> None:
        super().__init__(now)
        stamp = now.isoformat()
        self.tail = f"\tscheduled\t0\t0\t\t{_NULL}\t0\t{_NULL}\t\t\t{stamp}\t{stamp}\t"

    def join(self, rows: list[Any]) -> str:
        return "".join(rows)

    def encode(self, checked: Checked, source: str, first: datetime, due: datetime) -> str:
        values = checked.values
        task = self._tasks.get(values["task"]) or self._tasks.put(
            values["task"], _text(values["task"])
        )
        args, kwargs = checked.args_json or "", checked.kwargs_json or ""
        if "\\" in args:
            args = _text(args)
        if "\\" in kwargs:
            kwargs = _text(kwargs)
        first_text = self._times.get(first) or self._times.put(first, first.isoformat())
        due_text = first_text if due is first else due.isoformat()
        zone = values["timezone"]
        if isinstance(checked.schedule, Once):
            zone_text = self._zones.get(zone) or self._zones.put(zone, _text(zone))
            when = f"{first_text}\t\t{zone_text}\t{_NULL}\t{_NULL}\t"
        else:  # keyed by zone too: an interval does not carry the job's zone
            key = (checked.schedule, zone)
            when = self._schedules.get(key) or self._schedules.put(
                key, self._recurring(values, first)
            )
        return (
            f"{_text(values['name'])}\t{task}\t{args}\t{kwargs}\t{when}"
            f"{self._options_of(checked.options)}{source}\t{due_text}\t{first_text}{self.tail}"
            f"{self._extras_of(values)}\t{_free_text(values.get('description') or '')}"
            f"\t{self._tags_of(values)}\t{self._calendar_of(values)}"
            f"\t{self._tags_of(values, 'notify')}\n"
        )

    def _encode_calendar(self, calendar_id: int | None, mode: str, roll: str) -> str:
        return f"{_NULL if calendar_id is None else calendar_id}\t{mode}\t{roll}"

    def _encode_tags(self, tags_json: str) -> str:
        return _text(tags_json)

    def _encode_extras(self, values: dict[str, Any], options_json: str) -> str:
        def opt(value: Any) -> str:
            if value is None:
                return _NULL
            return value.isoformat() if isinstance(value, datetime) else repr(float(value))

        return (
            f"{'t' if values.get('cron_day_or', True) else 'f'}\t"
            f"{_text(values.get('dst_policy') or DEFAULT_DST_POLICY)}\t"
            f"{_text(values.get('solar_event') or '')}\t{opt(values.get('latitude'))}\t"
            f"{opt(values.get('longitude'))}\t{opt(values.get('not_before'))}\t"
            f"{opt(values.get('expires_at'))}\t{_text(options_json)}"
        )

    @staticmethod
    def _recurring(values: dict[str, Any], first: datetime) -> str:
        zone = _text(values["timezone"])
        if values["cron"]:
            return f"{_NULL}\t{_text(values['cron'])}\t{zone}\t{_NULL}\t{_NULL}\t"
        if values["interval"] is None:  # solar: its fields are among the extras
            return f"{_NULL}\t\t{zone}\t{_NULL}\t{_NULL}\t"
        anchor = (values.get("interval_anchor") or first).isoformat()  # default: its first
        return f"{_NULL}\t\t{zone}\t{_interval_text(values['interval'])}\t{anchor}\t"

    def _encode_options(self, options: Options) -> str:
        v = options.values
        return (
            f"{_text(v['queue'])}\t{v['priority']}\t{v['max_retries']}\t{v['jitter']}\t"
            f"{v['lease_seconds']}\t{v['misfire_max_catchup']}\t"
            f"{_interval_text(v['retry_backoff'])}\t{_interval_text(v['retry_backoff_max'])}\t"
            f"{_interval_text(v['misfire_grace'])}\t{v['misfire_policy']}\t"
            f"{v['when_retries_exhausted']}\t{_optional_interval_text(v['catchup_window'])}\t"
            f"{v['overlap']}\t{v['max_buffer']}\t{'t' if v['fixed_delay'] else 'f'}\t"
            f"{v['max_concurrent']}\t"
            f"{_optional_interval_text(v['start_deadline'])}\t{'t' if v['skip_late'] else 'f'}\t"
            f"{_optional_interval_text(v['max_runtime'])}\t"
            f"{'t' if v['revoke_overrun'] else 'f'}\t"
            f"{_NULL if v['finish_by'] is None else v['finish_by'].isoformat()}\t"
            f"{_NULL if v['alert_after_failures'] is None else v['alert_after_failures']}\t"
        )


# --- binary: per field a 4-byte length (-1: NULL) and the value in PostgreSQL's send format --

_I16 = struct.Struct(">h").pack
_I32 = struct.Struct(">i").pack
_LEN_I64 = struct.Struct(">iq").pack  # length 8, then the value
_NULL_B = _I32(-1)
_EMPTY_B = _I32(0)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_JSONB_VERSION = b"\x01"


def _b_text(value: str) -> bytes:
    data = value.encode()
    return _I32(len(data)) + data


def _b_int4(value: int) -> bytes:
    return _I32(4) + _I32(value)


def _b_int2(value: int) -> bytes:
    return _I32(2) + struct.pack(">h", value)


def _b_time(value: datetime) -> bytes:
    return _LEN_I64(8, (value - _PG_EPOCH) // _MICROSECOND)


def _b_clock(value: time) -> bytes:
    """A time of day: microseconds since midnight."""
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
    return _LEN_I64(8, micros + value.microsecond)


def _b_interval(value: timedelta) -> bytes:
    # microseconds, days, months: days stay days, as psycopg's binary dumper sends them
    micros = value.seconds * 1_000_000 + value.microseconds
    return _I32(16) + struct.pack(">qii", micros, value.days, 0)


class BinaryRows(CopyRows):
    format = "binary"
    header = b"PGCOPY\n\xff\r\n\x00" + _I32(0) + _I32(0)  # signature, flags, no extension
    trailer = _I16(-1)

    def __init__(self, now: datetime) -> None:
        super().__init__(now)
        stamp = _b_time(now)
        self.head = _I16(len(COPY_COLUMNS))
        zero8 = _LEN_I64(8, 0)
        # state, retry_count, missed_runs, claimed_by, lease_expires_at, token, last_run_at,
        # last_status, last_error, created_at, updated_at
        tail = (_b_text("scheduled"), _b_int4(0), zero8, _EMPTY_B, _NULL_B, zero8, _NULL_B)
        self.tail = b"".join((*tail, _EMPTY_B, _EMPTY_B, stamp, stamp))
        self._sources = _Memo()

    def join(self, rows: list[Any]) -> bytes:
        return b"".join(rows)

    def encode(self, checked: Checked, source: str, first: datetime, due: datetime) -> bytes:
        values = checked.values
        task = self._tasks.get(values["task"]) or self._tasks.put(
            values["task"], _b_text(values["task"])
        )
        name = values["name"].encode()
        args = (checked.args_json or "").encode()
        kwargs = (checked.kwargs_json or "").encode()
        first_b = self._times.get(first) or self._times.put(first, _b_time(first))
        due_b = first_b if due is first else _b_time(due)
        zone = values["timezone"]
        if isinstance(checked.schedule, Once):
            zone_b = self._zones.get(zone) or self._zones.put(zone, _b_text(zone))
            when = b"".join((first_b, _EMPTY_B, zone_b, _NULL_B, _NULL_B))
        else:  # keyed by zone too: an interval does not carry the job's zone
            key = (checked.schedule, zone)
            when = self._schedules.get(key) or self._schedules.put(
                key, self._recurring(values, first)
            )
        source_b = self._sources.get(source) or self._sources.put(source, _b_text(source))
        return b"".join(
            (
                self.head,
                _I32(len(name)),
                name,
                task,
                _I32(len(args) + 1),
                _JSONB_VERSION,
                args,
                _I32(len(kwargs) + 1),
                _JSONB_VERSION,
                kwargs,
                when,
                self._options_of(checked.options),
                source_b,
                due_b,
                first_b,
                self.tail,
                self._extras_of(values),
                _b_text(values.get("description") or ""),
                self._tags_of(values),
                self._calendar_of(values),
                self._tags_of(values, "notify"),
            )
        )

    def _encode_calendar(self, calendar_id: int | None, mode: str, roll: str) -> bytes:
        ident = _NULL_B if calendar_id is None else _LEN_I64(8, calendar_id)
        return ident + _b_text(mode) + _b_text(roll)

    def _encode_tags(self, tags_json: str) -> bytes:
        data = tags_json.encode()
        return _I32(len(data) + 1) + _JSONB_VERSION + data

    def _encode_extras(self, values: dict[str, Any], options_json: str) -> bytes:
        def opt(value: Any) -> bytes:
            if value is None:
                return _NULL_B
            if isinstance(value, datetime):
                return _b_time(value)
            return _I32(8) + struct.pack(">d", float(value))

        options = options_json.encode()
        return b"".join(
            (
                _I32(1) + (b"\x01" if values.get("cron_day_or", True) else b"\x00"),
                _b_text(values.get("dst_policy") or DEFAULT_DST_POLICY),
                _b_text(values.get("solar_event") or ""),
                opt(values.get("latitude")),
                opt(values.get("longitude")),
                opt(values.get("not_before")),
                opt(values.get("expires_at")),
                _I32(len(options) + 1) + _JSONB_VERSION + options,
            )
        )

    @staticmethod
    def _recurring(values: dict[str, Any], first: datetime) -> bytes:
        zone = _b_text(values["timezone"])
        if values["cron"]:
            return _NULL_B + _b_text(values["cron"]) + zone + _NULL_B + _NULL_B
        if values["interval"] is None:  # solar: its fields are among the extras
            return _NULL_B + _EMPTY_B + zone + _NULL_B + _NULL_B
        anchor = _b_time(values.get("interval_anchor") or first)  # default: its first
        return _NULL_B + _EMPTY_B + zone + _b_interval(values["interval"]) + anchor

    def _encode_options(self, options: Options) -> bytes:
        v = options.values
        return b"".join(
            (
                _b_text(v["queue"]),
                _b_int2(v["priority"]),  # smallint: the bounded claim priority
                _b_int4(v["max_retries"]),
                _b_int4(v["jitter"]),
                _b_int4(v["lease_seconds"]),
                _b_int4(v["misfire_max_catchup"]),
                _b_interval(v["retry_backoff"]),
                _b_interval(v["retry_backoff_max"]),
                _b_interval(v["misfire_grace"]),
                _b_text(v["misfire_policy"]),
                _b_text(v["when_retries_exhausted"]),
                _NULL_B if v["catchup_window"] is None else _b_interval(v["catchup_window"]),
                _b_text(v["overlap"]),
                _b_int4(v["max_buffer"]),
                _I32(1) + (b"\x01" if v["fixed_delay"] else b"\x00"),
                _b_int4(v["max_concurrent"]),
                _NULL_B if v["start_deadline"] is None else _b_interval(v["start_deadline"]),
                _I32(1) + (b"\x01" if v["skip_late"] else b"\x00"),
                _NULL_B if v["max_runtime"] is None else _b_interval(v["max_runtime"]),
                _I32(1) + (b"\x01" if v["revoke_overrun"] else b"\x00"),
                _NULL_B if v["finish_by"] is None else _b_clock(v["finish_by"]),
                _NULL_B
                if v["alert_after_failures"] is None
                else _b_int4(v["alert_after_failures"]),
            )
        )


ENCODERS: dict[str, type[CopyRows]] = {"text": TextRows, "binary": BinaryRows}
