"""Bulk scheduling: a stream of job specs, validated by the API's own rules, written at the
database's speed (``api.schedule_many`` is the public entry point).

Specs are read chunk by chunk and never all held: memory is bounded by the chunk size, not by
the number of jobs. Each spec goes through the same ``JobValidator`` as ``api.schedule``,
which remembers what specs share (tasks, zones, crons, intervals, options); the first fire
time is computed from one reading of the database clock, once per distinct schedule.

Writes happen in one transaction, through the store (``Store.insert_jobs``: the database's
own statements live there). On PostgreSQL a chunk's specs are read first (a spec generator may
query the database, which it cannot do mid-COPY), then validated and encoded while the
store's ``COPY ... FROM STDIN`` streams the rows straight into ``schedapp_job``, so PostgreSQL
stores rows while this process builds the next ones, inside a savepoint:
the unique index on ``name`` finds duplicate names, within the input and against existing
jobs, at no extra cost. Only when it refuses a chunk is that chunk rolled back and looked at
(one query for its names); a clash with a job of the same call is traced back to its spec by
the rows' ``xmin`` (each chunk's savepoint has its own transaction id) and id order. The
portable store gets ``bulk_create`` per chunk, after a query for the chunk's names.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import random
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from . import audit, job_calendars, ledger, policies
from .db import db_now, notify_due
from .exceptions import ScheduleError
from .fields import with_defaults
from .models import Job, JobSource
from .schedules import Interval, Once, Schedule, first_fire_time
from .store import CopyingStore, InsertedJobs, JobRows, NameTaken, Store, get_store
from .validation import (
    Checked,
    JobValidator,
    generated_name,
    job_defaults,
    name_taken,
    source_problem,
)

CHUNK_SIZE = 10_000
COPY_FORMAT = "binary"  # or "text": both are measured by bench/ingest.py
# Specs reported as bad before the call stops reading: one bad spec already rejects the lot,
# and a million errors would not fit the memory bound either.
MAX_BAD_SPECS = 1_000
# Ledger records per INSERT: 7 parameters each, under PostgreSQL's 65,535 per statement (a
# chunk of 10,000 jobs with a record or two each is two or three inserts)
_RECORDS_PER_INSERT = 8_000
_RETRIES = 3  # attempts at a chunk whose names other writers keep taking meanwhile

Row = tuple[int, str, Any]  # (spec index, job name, COPY line or Job instance)
Ranges = tuple[policies.MissedRange, ...]


def schedule_many(specs: Iterable[Mapping[str, Any]], *, chunk_size: int = CHUNK_SIZE) -> int:
    """Validate and write ``specs``; returns how many jobs were created (see the API)."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1.")
    with transaction.atomic():
        now = db_now()
        store = get_store()
        encoder = store.job_rows(now, COPY_FORMAT)
        ingest = _Ingest(now, encoder)
        writer: _Writer
        if store.copies_rows:
            writer = _CopyWriter(ingest, encoder, store)  # type: ignore[arg-type]
        else:
            writer = _OrmWriter(ingest, encoder, store)
        pending = iter(specs)
        start = 0
        while not ingest.stopped:
            # A chunk's specs are read before its COPY starts, as ``specs`` may query the
            # database (a queryset's iterator, a clock), which it cannot do mid-COPY; they are
            # validated and encoded during the COPY, so that PostgreSQL stores the rows sent
            # while this process builds the next ones (read and validated first, the two took
            # turns: one core busy of two).
            chunk = collections.deque(itertools.islice(pending, chunk_size))
            writer.write_chunk(start, ingest.rows(_draining(chunk), start, chunk_size))
            writer.report_names_of_refused(ingest.take_refused())
            if ingest.consumed < chunk_size:
                break
            start += ingest.consumed
        if ingest.errors:
            raise ValidationError(ingest.report())
        if ingest.written:
            notify_due(ingest.earliest)
    return ingest.written


def _draining(specs: collections.deque[Any]) -> Iterator[Any]:
    """The specs of a chunk, each let go of as it is taken: the chunk's raw specs shrink
    while its rows grow."""
    while specs:
        yield specs.popleft()


class _Ingest:
    """Turns specs into rows: defaults, validation, first fire time; collects the errors."""

    def __init__(self, now: datetime, encoder: JobRows) -> None:
        self.now = now
        self.encoder = encoder
        # every calendar read now: no other statement may run while the COPY streams the rows
        self.validator = JobValidator(calendars=job_calendars.known())
        self.defaults = job_defaults()
        # Unnamed jobs get "<task>-<call>-<index>": unique within the call by construction
        # (random 48-bit suffixes would collide somewhere in ten million with odds ~1 in 6).
        self.call = uuid.uuid4().hex[:12]
        self.errors: dict[str, list[str]] = {}
        self.bad = 0
        self.stopped = False
        self.consumed = 0
        self.written = 0
        self.earliest: datetime | None = None
        self._sources: dict[str, tuple[str, str | None]] = {}
        # (index, name) of the specs refused in this chunk: told after it is written whether
        # their name is taken too, so a spec's report holds all of its problems
        self._refused: list[tuple[int, str]] = []
        self._firsts: dict[Any, tuple[datetime, datetime | None, Ranges]] = {}
        # What the calendars of this chunk's specs excluded or merged before their first runs,
        # by spec index: recorded in the ledger once the chunk is written (``record_calendar``)
        self._ranges: dict[int, Ranges] = {}
        self._random = random.random

    def rows(self, specs: Iterator[Any], start: int, limit: int) -> Iterator[Row]:
        """The rows of the next ``limit`` specs (``consumed`` says how many were read)."""
        self.consumed = 0
        for index, raw in enumerate(itertools.islice(specs, limit), start):
            self.consumed += 1
            row = self.row(index, raw)
            if row is not None:
                yield row
            elif self.stopped:
                return

    def row(self, index: int, raw: Any) -> Row | None:
        if type(raw) is not dict and not isinstance(raw, Mapping):
            self.fail(index, {"__all__": ["must be a mapping of job options."]})
            return None
        values = with_defaults(self.defaults, raw)
        source = values.pop("source", "api")
        task = values["task"]
        if values["name"] is None and isinstance(task, str):
            values["name"] = generated_name(task, f"-{self.call}-{index}")
        checked = self.validator.check(values)
        if checked.errors:
            self.fail(index, checked.errors, values["name"])
            return None
        source, problem = self._source(source)
        if problem:
            self.fail(index, {"source": [problem]}, values["name"])
            return None
        try:
            first, due, ranges = self._first_run(checked)
        except ScheduleError as exc:  # an expiry already passed
            self.fail(index, {exc.field: [exc.message]}, values["name"])
            return None
        if self.earliest is None or due < self.earliest:
            self.earliest = due
        if ranges:
            self._ranges[index] = ranges
        return index, checked.values["name"], self.encoder.encode(checked, source, first, due)

    def _first_run(self, checked: Checked) -> tuple[datetime, datetime, Ranges]:
        """(occurrence, due time, what its calendar excluded or merged before it): as
        ``api.schedule`` computes them, from the same ``now``."""
        schedule = checked.schedule
        assert schedule is not None
        values = checked.values
        calendar = values.get("calendar")
        ranges: Ranges = ()
        if isinstance(schedule, Once):
            first = schedule.at
        else:
            key = (
                schedule
                if calendar is None
                else (
                    schedule,
                    calendar.pk,
                    values["calendar_mode"],
                    values["calendar_roll"],
                    values["timezone"],
                )
            )
            found = self._firsts.get(key)
            if found is None:
                if len(self._firsts) > 4096:
                    self._firsts.clear()
                found = self._firsts[key] = self._first(schedule, values)
            first, anchor, ranges = found
            if anchor is not None:
                values["interval_anchor"] = anchor
        jitter = checked.options.values["jitter"]  # type: ignore[union-attr]
        if jitter > 0:
            return first, first + policies.compute_jitter(jitter, self._random), ranges
        return first, first, ranges

    def _first(
        self, schedule: Schedule, values: dict[str, Any]
    ) -> tuple[datetime, datetime | None, Ranges]:
        """The first run, under the job's calendar if it follows one (as ``api.schedule``),
        the interval's phase to store when the first run is not its first occurrence, and what
        the calendar excluded or merged before the first run (for the ledger)."""
        if values.get("calendar") is None:
            return first_fire_time(schedule, self.now), None, ()
        anchor = None
        if isinstance(schedule, Interval) and schedule.anchor is None:
            # the phase is the first occurrence (as api.schedule keeps it), not the first run
            anchor = first_fire_time(schedule, self.now)
            schedule = replace(schedule, anchor=anchor)
        cal = job_calendars.on_calendar(
            job_calendars.parsed(values["calendar"], known=self.validator.calendars),
            values["calendar_mode"],
            values["calendar_roll"],
            values["timezone"],
        )
        first, ranges = policies.first_run(schedule, self.now, cal)
        return first, anchor, ranges

    def record_calendar(self, rows: list[Row]) -> None:
        """Record in the ledger what the calendars of a written chunk's jobs excluded or
        merged before their first runs, as ``api.schedule`` does: in the call's transaction,
        one query for the jobs' ids and one insert per 8,000 records (none for a chunk of
        jobs without calendars). Specs refused in the chunk are forgotten with it."""
        pending, self._ranges = self._ranges, {}
        if not pending:
            return
        written = {row[1]: pending[row[0]] for row in rows if row[0] in pending}
        if not written:
            return
        ids = dict(Job.objects.filter(name__in=list(written)).values_list("name", "id"))
        decided = [(ids[name], r) for name, ranges in written.items() for r in ranges]
        for start in range(0, len(decided), _RECORDS_PER_INSERT):
            ledger.record(decided[start : start + _RECORDS_PER_INSERT], "schedule_many")

    def _source(self, source: Any) -> tuple[str, str | None]:
        """(the value to store, why it may not be stored): the API's rule, as text."""
        cacheable = isinstance(source, str)  # JobSource members are strs too
        verdict = self._sources.get(source) if cacheable else None
        if verdict is None:
            problem = source_problem(source)
            verdict = ("", problem) if problem else (JobSource(source).value, None)
            if cacheable:
                self._sources[source] = verdict
        return verdict

    def fail(self, index: int, errors: Mapping[str, list[str]], name: Any = None) -> None:
        """Record a spec's errors; ``name``, the name of a spec refused before it could be
        written, is looked up once its chunk is written (``take_refused``)."""
        for field, messages in errors.items():
            self.errors[f"{index}.{field}"] = list(messages)
        if isinstance(name, str) and "name" not in errors:
            self._refused.append((index, name))
        self.bad += 1
        if self.bad >= MAX_BAD_SPECS:
            self.stopped = True

    def take_refused(self) -> list[tuple[int, str]]:
        refused, self._refused = self._refused, []
        return refused

    def report(self) -> dict[str, list[str]]:
        if self.stopped:
            return {
                **self.errors,
                "__all__": [f"stopped after {MAX_BAD_SPECS} bad specs; the rest were not checked."],
            }
        return self.errors


# --- writers: rows -> table, chunk by chunk; duplicate names traced to their specs ------------


@dataclass(frozen=True)
class _Chunk:
    """Where one written chunk's jobs are: enough to map a job back to its spec index
    without holding the chunk's ids or names."""

    first: int  # index of the chunk's first spec
    skipped: tuple[int, ...]  # indexes in the chunk's range that were not written (bad specs)
    count: int  # jobs written
    inserted: InsertedJobs  # where the store put them (ids, PostgreSQL's transaction id)

    def index_at(self, position: int) -> int:
        """The spec index of the chunk's ``position``-th written job."""
        index = self.first + position
        for skipped in self.skipped:
            if skipped <= index:
                index += 1
        return index


class _Writer:
    def __init__(self, ingest: _Ingest, encoder: JobRows, store: Store) -> None:
        self.ingest = ingest
        self.encoder = encoder  # what the store's insert_jobs takes the rows of
        self.store = store
        self.chunks: list[_Chunk] = []  # one small record per chunk written

    def write_chunk(self, first: int, rows: Iterator[Row]) -> None:
        raise NotImplementedError

    def _owner(self, job_id: int, xid: str) -> int | None:
        """The spec index of a job this call wrote, or None for a job that existed before."""
        raise NotImplementedError

    def _holders(self, names: list[str]) -> dict[str, tuple[int, str]]:
        """The jobs holding any of ``names``: name -> (id, what ``_owner`` needs)."""
        return self.store.jobs_named(names)

    def report_names_of_refused(self, refused: list[tuple[int, str]]) -> None:
        """Specs refused for other problems (``(index, name)``, after their chunk is written)
        are told too when their name is taken by an older job or by a spec written before
        them, as a written spec would be: their report was missing it. A refused spec is not
        written, so it holds no name: a later spec may take it."""
        if not refused:
            return
        found = self._holders(sorted({name for _, name in refused}))
        for index, name in refused:
            holder = found.get(name)
            if holder is None:
                continue
            owner = self._owner(*holder)
            if owner is None:
                message = name_taken(name)
            elif owner < index:
                message = f"duplicates the name of spec {owner}."
            else:
                continue  # a later spec of the same chunk took it
            self.ingest.errors.setdefault(f"{index}.name", []).append(message)

    def _sort_out(
        self, rows: list[Row], found: Mapping[str, tuple[int, str]]
    ) -> tuple[list[Row], dict[int, str]]:
        """Rows whose names clash nowhere, and the errors of the others, by spec index.

        The first spec with a name keeps it; a later one is told which spec has it (also if
        that one was written in an earlier chunk); a name held by an older job is taken."""
        survivors: list[Row] = []
        errors: dict[int, str] = {}
        seen: dict[str, int] = {}
        for row in rows:
            index, name = row[0], row[1]
            earlier = seen.get(name)
            if earlier is not None:
                errors[index] = f"duplicates the name of spec {earlier}."
                continue
            seen[name] = index
            holder = found.get(name)
            if holder is None:
                survivors.append(row)
                continue
            owner = self._owner(*holder)
            errors[index] = (
                name_taken(name) if owner is None else f"duplicates the name of spec {owner}."
            )
        return survivors, errors

    def _chunk(self, first: int, rows: list[Row], inserted: InsertedJobs) -> None:
        """Remember where a written chunk's jobs are (its specs are all read by now)."""
        end = first + self.ingest.consumed
        skipped: tuple[int, ...] = ()
        if len(rows) < end - first:
            written = {row[0] for row in rows}
            skipped = tuple(i for i in range(first, end) if i not in written)
        self.chunks.append(_Chunk(first, skipped, len(rows), inserted))
        self.ingest.written += len(rows)
        audit.record_created([row[1] for row in rows])
        self.ingest.record_calendar(rows)

    def _report(self, errors: Mapping[int, str]) -> None:
        for index, message in errors.items():
            self.ingest.fail(index, {"name": [message]})


class _CopyWriter(_Writer):
    """A store that copies rows (PostgreSQL): each chunk sent at once, names looked at only
    when the unique index refused it."""

    store: CopyingStore

    def __init__(self, ingest: _Ingest, encoder: JobRows, store: CopyingStore) -> None:
        super().__init__(ingest, encoder, store)
        self.by_xid: dict[str, _Chunk] = {}

    def write_chunk(self, first: int, rows: Iterator[Row]) -> None:
        head = next(rows, None)
        if head is None:
            return  # nothing valid to write: no savepoint, no COPY
        rows = itertools.chain((head,), rows)
        kept: list[Row] = []
        try:
            inserted = self._copy(rows, kept)
        except NameTaken:
            kept.extend(rows)  # what the COPY had not taken yet
            self._write_checked(first, kept)
            return
        self._record(first, kept, inserted)

    def _copy(self, rows: Iterable[Row], kept: list[Row]) -> InsertedJobs:
        """Insert ``rows`` (appending each to ``kept`` as the store takes it); NameTaken if
        the unique index refused one, with nothing of them written."""

        def lines() -> Iterator[Any]:
            for row in rows:
                kept.append(row)
                yield row[2]

        return self.store.insert_jobs(self.encoder, lines())

    def _record(self, first: int, rows: list[Row], inserted: InsertedJobs) -> None:
        """Note the chunk's last id and its savepoint's transaction id (its rows' ``xmin``)."""
        self._chunk(first, rows, inserted)
        self.by_xid[inserted.xid] = self.chunks[-1]

    def _write_checked(self, first: int, rows: list[Row]) -> None:
        """A chunk the unique index refused: find its clashes, write the rest (so that later
        chunks still see these names), report the clashes."""
        for _attempt in range(_RETRIES):
            found = self._holders([row[1] for row in rows])
            survivors, errors = self._sort_out(rows, found)
            kept: list[Row] = []
            inserted = None
            try:
                if survivors:
                    inserted = self._copy(survivors, kept)
            except NameTaken:  # another writer committed one of these names meanwhile
                continue
            self._report(errors)
            if inserted is not None:
                self._record(first, kept, inserted)
            return
        raise ValidationError({"__all__": ["job names kept clashing with concurrent writers."]})

    def _owner(self, job_id: int, xid: str) -> int | None:
        chunk = self.by_xid.get(xid)
        if chunk is None:
            return None  # written by another, committed transaction: an existing job
        from_here_on = self.store.inserted_from(job_id, chunk.inserted)
        return chunk.index_at(chunk.count - from_here_on)


class _OrmWriter(_Writer):
    """The portable store (SQLite in the demo): ``bulk_create`` per chunk, names looked up
    first."""

    def write_chunk(self, first: int, rows: Iterator[Row]) -> None:
        chunk = list(rows)
        if not chunk:
            return
        names = [row[1] for row in chunk]
        for _attempt in range(_RETRIES):
            found = self._holders(names)
            survivors, errors = self._sort_out(chunk, found)
            inserted = None
            try:
                if survivors:
                    inserted = self.store.insert_jobs(self.encoder, [row[2] for row in survivors])
            except NameTaken:
                continue
            self._report(errors)
            if inserted is not None:
                self._chunk(first, survivors, inserted)
            return
        raise ValidationError({"__all__": ["job names kept clashing with concurrent writers."]})

    def _owner(self, job_id: int, xid: str) -> int | None:
        for chunk in self.chunks:
            inserted = chunk.inserted
            if inserted.first_id <= job_id <= inserted.last_id:
                if not inserted.ids:
                    return chunk.index_at(job_id - inserted.first_id)
                position = bisect.bisect_left(inserted.ids, job_id)
                if position < len(inserted.ids) and inserted.ids[position] == job_id:
                    return chunk.index_at(position)
        return None
