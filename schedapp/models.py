"""Jobs (what to run and when), runs (one row per dispatched attempt), and fleet nodes.

The job table is the hot table: it stays narrow (history lives in ``JobRun``), and two partial
indexes cover exactly what beats look for, so a claim costs the same with ten thousand jobs as
with ten million: the due slice of ``scheduled`` jobs, and the ``running`` jobs whose lease
may have expired.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.db.models.lookups import Exact

from .calendars import MODES as CALENDAR_MODES
from .calendars import ROLLS as CALENDAR_ROLLS
from .conf import get_settings
from .message import idempotency_key, parse_task_id, task_id_for
from .policies import (
    FATES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    MISFIRE_POLICIES,
    OVERLAP_POLICIES,
    WHEN_RETRIES_EXHAUSTED,
)
from .schedules import (
    DEFAULT_DST_POLICY,
    DST_POLICIES,
    Interval,
    Once,
    Schedule,
    Solar,
    parse_cron,
    with_window,
)


def _default_timezone() -> str:
    return settings.TIME_ZONE or "UTC"


def _default_lease() -> int:
    return get_settings().DEFAULT_LEASE_SECONDS


def _default_max_retries() -> int:
    return get_settings().DEFAULT_MAX_RETRIES


def _default_backoff() -> timedelta:
    return get_settings().DEFAULT_RETRY_BACKOFF


def _default_backoff_max() -> timedelta:
    return get_settings().DEFAULT_RETRY_BACKOFF_MAX


def _default_misfire_policy() -> str:
    return get_settings().DEFAULT_MISFIRE_POLICY


def _default_misfire_grace() -> timedelta:
    return get_settings().DEFAULT_MISFIRE_GRACE


def _default_max_catchup() -> int:
    return get_settings().DEFAULT_MISFIRE_MAX_CATCHUP


def _default_catchup_window() -> timedelta | None:
    return get_settings().DEFAULT_CATCHUP_WINDOW


def _deadline_default(name: str) -> Any:
    """A deadline field's default from ``SCHEDAPP_DEADLINES`` (seconds read as a duration)."""
    value = get_settings().DEADLINES.get(name, DEADLINE_UNSET[name])
    if name in ("start_deadline", "max_runtime") and isinstance(value, int | float):
        if not isinstance(value, bool):
            return timedelta(seconds=value)
    if name == "finish_by" and isinstance(value, str):
        try:
            return time.fromisoformat(value)
        except ValueError:
            return value  # the settings check names it
    return value


# The deadline fields and their value when neither the job nor SCHEDAPP_DEADLINES sets one.
DEADLINE_UNSET: dict[str, Any] = {
    "start_deadline": None,
    "skip_late": False,
    "max_runtime": None,
    "revoke_overrun": False,
    "finish_by": None,
    "alert_after_failures": None,
}


def _default_start_deadline() -> timedelta | None:
    return _deadline_default("start_deadline")


def _default_skip_late() -> bool:
    return _deadline_default("skip_late")


def _default_max_runtime() -> timedelta | None:
    return _deadline_default("max_runtime")


def _default_revoke_overrun() -> bool:
    return _deadline_default("revoke_overrun")


def _default_finish_by() -> time | None:
    return _deadline_default("finish_by")


def _default_alert_after_failures() -> int | None:
    return _deadline_default("alert_after_failures")


# The values a job's columns may hold beyond what the API checks: what PostgreSQL would take
# but Python cannot read back, or schedapp cannot go on from (DESIGN 25, migration 0016).
# A time is finite and within Python's years 1-9999, a day inside them (a local time in any
# zone still fits); a duration is not negative and fits Python's timedelta (at most 999,999,999
# days; PostgreSQL counts a month as 30 days, psycopg a year as 365: hence the margin); the
# counters the claim adds to (token, retry_count, missed_runs) have room to be added to.
# A duration's upper bound is PostgreSQL's alone (migrations 0016 and 0019 add it as
# schedapp_job_<column>_readable, outside Django's constraints): SQLite stores a duration as
# 64-bit microseconds, at most 106,751,991 days, and cannot even be given this one.
TIME_MIN = datetime(1, 1, 2, tzinfo=UTC)
TIME_MAX = datetime(9999, 12, 30, tzinfo=UTC)
DURATION_MAX = timedelta(days=900_000_000)
COUNTER_MAX = 2**62
TIME_COLUMNS = (
    "run_at",
    "interval_anchor",
    "not_before",
    "expires_at",
    "next_run_at",
    "scheduled_for",
    "lease_expires_at",
    "last_run_at",
    "created_at",
    "updated_at",
    "finish_by_at",
)
DURATION_COLUMNS = (
    "interval",
    "retry_backoff",
    "retry_backoff_max",
    "misfire_grace",
    "catchup_window",
    "start_deadline",
    "max_runtime",
)
# Durations that must be more than 0 (the others: not negative): a zero interval never moves
# on, and a zero catch-up window would refuse every occurrence the claim finds late.
POSITIVE_DURATIONS = ("interval", "catchup_window", "start_deadline", "max_runtime")


class JSONType(models.Func):
    """The type of a JSON column's value ("array", "object", ...), for check constraints:
    PostgreSQL's ``jsonb_typeof``, SQLite's ``json_type``."""

    function = "jsonb_typeof"
    output_field = models.CharField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return super().as_sql(compiler, connection, function="json_type", **extra)


# Each JSON column's one valid shape: what a message carries as args and kwargs, and options.
JSON_SHAPES = {"args": "array", "kwargs": "object", "message_options": "object"}


def _value_constraints() -> list[models.CheckConstraint]:
    """One check per column whose type admits values schedapp can never use."""
    checks = [
        models.CheckConstraint(
            name="schedapp_job_occurrence_known",
            condition=Q(next_run_at__isnull=True) | Q(scheduled_for__isnull=False),
            violation_error_message="A job with a next_run_at needs the occurrence it is for "
            "(scheduled_for).",
        ),
        models.CheckConstraint(
            name="schedapp_job_running_has_lease",
            condition=~Q(state="running") | Q(lease_expires_at__isnull=False),
            violation_error_message="A running job needs its lease (lease_expires_at): without "
            "it, it would never be reaped.",
        ),
        models.CheckConstraint(
            name="schedapp_job_token_in_range", condition=Q(token__gte=0, token__lt=COUNTER_MAX)
        ),
        models.CheckConstraint(
            name="schedapp_job_retry_count_in_range", condition=Q(retry_count__lt=2**31 - 1)
        ),
        models.CheckConstraint(
            name="schedapp_job_missed_runs_in_range", condition=Q(missed_runs__lt=COUNTER_MAX)
        ),
    ]
    for column, bound in (("latitude", 90), ("longitude", 180)):  # NaN is out of any range
        checks.append(
            models.CheckConstraint(
                name=f"schedapp_job_{column}_in_range",
                condition=Q(**{f"{column}__isnull": True})
                | Q(**{f"{column}__gte": -bound, f"{column}__lte": bound}),
                violation_error_message=f"{column} must be -{bound} to {bound} degrees.",
            )
        )
    for column, choices in (
        ("state", JobState),
        ("misfire_policy", MisfirePolicy),
        ("dst_policy", DstPolicy),
    ):
        checks.append(
            models.CheckConstraint(
                name=f"schedapp_job_{column}_valid",
                condition=Q(**{f"{column}__in": choices.values}),
                violation_error_message=f"{column} must be one of {', '.join(choices.values)}.",
            )
        )
    for column, shape in JSON_SHAPES.items():
        checks.append(
            models.CheckConstraint(
                name=f"schedapp_job_{column}_{shape}",
                condition=Exact(JSONType(column), shape),
                violation_error_message=f"{column} must be a JSON {shape}.",
            )
        )
    for column in TIME_COLUMNS:
        checks.append(
            models.CheckConstraint(
                name=f"schedapp_job_{column}_in_range",
                condition=Q(**{f"{column}__isnull": True})
                | Q(**{f"{column}__gte": TIME_MIN, f"{column}__lte": TIME_MAX}),
                violation_error_message=f"{column} must be a time between years 1 and 9999.",
            )
        )
    for column in DURATION_COLUMNS:  # (their upper bound: DURATION_MAX)
        positive = column in POSITIVE_DURATIONS
        lowest = {f"{column}__gt" if positive else f"{column}__gte": timedelta(0)}
        checks.append(
            models.CheckConstraint(
                name=f"schedapp_job_{column}_in_range",
                condition=Q(**{f"{column}__isnull": True}) | Q(**lowest),
                violation_error_message=f"{column} must be "
                + ("more than 0." if positive else "a duration, not negative."),
            )
        )
    return checks


class JobState(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"  # waiting for next_run_at
    RUNNING = "running", "Running"  # claimed under a lease: dispatched or executing
    PAUSED = "paused", "Paused"
    SUCCEEDED = "succeeded", "Succeeded"  # a one-off job that ran
    DEAD = "dead", "Dead"  # retries exhausted: a dead letter for a person to look at
    CANCELLED = "cancelled", "Cancelled"


class JobSource(models.TextChoices):
    API = "api", "Python API"
    ADMIN = "admin", "Admin"
    DECLARED = "declared", "Declared in code (SCHEDAPP_JOBS)"
    IMPORTED = "imported", "Imported"


class MisfirePolicy(models.TextChoices):
    RUN_ONCE = "run_once", "Run once, then continue"
    SKIP = "skip", "Skip missed occurrences"
    RUN_ALL = "run_all", "Run every missed occurrence (bounded)"
    RUN_RECENT = "run_recent", "Run the latest missed occurrence if within the grace, else skip"


assert tuple(MisfirePolicy.values) == MISFIRE_POLICIES


class DstPolicy(models.TextChoices):
    """What a fixed-hour cron does with a wall time the clocks skip (gap) or repeat (fold):
    ``cronmath.DstRule`` holds the rule, docs/semantics.md the table."""

    GAP_END_FIRST = "gap_end+first", "Gap: at its end; repeated hour: first offset (default)"
    GAP_END_SECOND = "gap_end+second", "Gap: at its end; repeated hour: second offset"
    GAP_END_BOTH = "gap_end+both", "Gap: at its end; repeated hour: both offsets"
    SKIP_FIRST = "skip+first", "Gap: skipped; repeated hour: first offset"
    SKIP_SECOND = "skip+second", "Gap: skipped; repeated hour: second offset"
    SKIP_BOTH = "skip+both", "Gap: skipped; repeated hour: both offsets"
    CELERY = "celery", "As Celery beat (gap: at the old offset; repeated hour: first offset)"


assert tuple(DstPolicy.values) == DST_POLICIES


class WhenRetriesExhausted(models.TextChoices):
    DEAD = "dead", "Dead-letter the job (a person requeues it)"
    NEXT_OCCURRENCE = "next_occurrence", "Record the failure, go on with the next occurrence"


assert tuple(WhenRetriesExhausted.values) == WHEN_RETRIES_EXHAUSTED


class Overlap(models.TextChoices):
    SKIP = "skip", "Skip occurrences that come due while a run is in flight"
    BUFFER_ONE = "buffer_one", "Buffer one: it waits for the run (then the misfire policy)"
    BUFFER_ALL = "buffer_all", "Buffer all (up to max_buffer): each runs after the run"
    CANCEL_OTHER = "cancel_other", "Cancel the run in flight (revoke); the latest then runs"
    TERMINATE_OTHER = "terminate_other", "Terminate the run in flight (SIGTERM); the latest runs"
    ALLOW_ALL = "allow_all", "Allow all (up to max_concurrent): each starts on time, own lease"


assert tuple(Overlap.values) == OVERLAP_POLICIES


class CalendarMode(models.TextChoices):
    EXCLUDE = "exclude", "Exclude: never run inside the calendar"
    ONLY = "only", "Only: run only inside the calendar's windows"


class CalendarRoll(models.TextChoices):
    SKIP = "skip", "Skip an occurrence that falls in an exclusion"
    NEXT_BUSINESS_DAY = "next_business_day", "Move it to the next business day"
    PREVIOUS_BUSINESS_DAY = "previous_business_day", "Move it to the previous business day"
    DEFER = "defer", "Defer it to the end of the exclusion"


assert tuple(CalendarMode.values) == CALENDAR_MODES
assert tuple(CalendarRoll.values) == CALENDAR_ROLLS


class Job(models.Model):
    # Unique through a constraint, not unique=True: on PostgreSQL that would add a second,
    # varchar_pattern_ops index that nothing uses, and every claim rewrites every index.
    name = models.CharField(max_length=200)
    task = models.CharField(max_length=200, help_text="Registered Celery task name.")
    # What the job is for, for people (django-celery-beat's PeriodicTask.description).
    description = models.TextField(blank=True, default="", db_default="")
    # Labels grouping jobs (the admin's filter, metrics, alert routing): lowercased, sorted,
    # each once (schedapp.validation). On PostgreSQL a GIN index serves "tagged" (0026).
    tags = models.JSONField(default=list, blank=True, db_default=[])
    # Notification channels (SCHEDAPP_NOTIFICATIONS) this job's events go to whatever their
    # tag filters say (their kinds still apply): a JSON list of channel names, sorted.
    notify = models.JSONField(default=list, blank=True, db_default=[])
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)

    # Exactly one schedule (see the check constraint below).
    run_at = models.DateTimeField(null=True, blank=True, help_text="One-off: run at this time.")
    cron = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="5 fields, or 6 with seconds first, e.g. '*/10 * * * * *'.",
    )
    timezone = models.CharField(max_length=64, default=_default_timezone)
    interval = models.DurationField(null=True, blank=True, help_text="Recurring: every ...")
    interval_anchor = models.DateTimeField(
        null=True,
        blank=True,
        help_text="An interval's occurrences fall at this instant plus whole intervals "
        "(default: its first occurrence), so extra runs never shift them.",
    )

    # Both day fields of a cron restricted: True fires on a day matching either (cron's rule),
    # False only on a day matching both (Celery's crontab; everything imported from Celery).
    cron_day_or = models.BooleanField(
        default=True,
        db_default=True,
        help_text="When both day fields are restricted: fire on days matching either "
        "(cron) rather than both (Celery's crontab).",
    )
    # A cron's daylight-saving policy: what a fixed-hour time in the spring-forward gap and one
    # in the repeated autumn hour do (DstPolicy); intervals and solar events ignore it.
    dst_policy = models.CharField(
        max_length=16,
        choices=DstPolicy.choices,
        default=DEFAULT_DST_POLICY,
        db_default=DEFAULT_DST_POLICY,
        help_text="A cron's daylight-saving rule: a time the clocks skip runs at the gap's end "
        "or is skipped; one they repeat runs at the first offset, the second, or both; or "
        "'celery': as Celery beat.",
    )
    # Solar: Celery's solar(event, latitude, longitude), one of the four schedule kinds.
    solar_event = models.CharField(max_length=32, blank=True, default="", db_default="")
    latitude = models.FloatField(null=True, blank=True)
    longitude = models.FloatField(null=True, blank=True)
    # django-celery-beat's start_time and expires, for any recurring schedule.
    not_before = models.DateTimeField(
        null=True, blank=True, help_text="Never fires before this instant."
    )
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="No occurrence after this instant: the job finishes."
    )
    # What apply_async's options would say for this job's messages, over the task's own:
    # queue, routing_key, exchange, priority (message priority, not the claim priority),
    # expires (seconds), headers, time_limit and soft_time_limit (seconds).
    message_options = models.JSONField(
        default=dict,
        blank=True,
        db_default=models.Value({}, output_field=models.JSONField()),
        help_text="Celery message options: queue, routing_key, exchange, priority, expires, "
        "headers.",
    )

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.SCHEDULED)
    priority = models.SmallIntegerField(
        default=MIN_PRIORITY,
        help_text=f"{MIN_PRIORITY}-{MAX_PRIORITY}: when more is due than beats can take at "
        "once, higher is claimed first.",
    )
    queue = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Celery queue; empty uses the task's routing.",
    )

    max_retries = models.PositiveIntegerField(default=_default_max_retries)
    retry_backoff = models.DurationField(default=_default_backoff)
    retry_backoff_max = models.DurationField(default=_default_backoff_max)
    when_retries_exhausted = models.CharField(
        max_length=16,
        choices=WhenRetriesExhausted.choices,
        default=WhenRetriesExhausted.DEAD,
        db_default=WhenRetriesExhausted.DEAD,
        help_text="When an occurrence fails and its retries are spent: the job goes dead, or "
        "(Celery beat's way) records the failure and waits for its next occurrence; a job "
        "with no next occurrence goes dead either way.",
    )
    jitter = models.PositiveIntegerField(
        default=0, help_text="Seconds: each fire is spread uniformly in [t, t + jitter]."
    )
    lease_seconds = models.PositiveIntegerField(default=_default_lease)
    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=_default_misfire_policy
    )
    misfire_grace = models.DurationField(default=_default_misfire_grace)
    misfire_max_catchup = models.PositiveIntegerField(default=_default_max_catchup)
    # NULL (no window) in the database when not written: an older release's rows during a
    # rolling deploy keep today's behaviour.
    catchup_window = models.DurationField(
        null=True,
        blank=True,
        default=_default_catchup_window,
        help_text="An occurrence missed longer ago than this is recorded as missed and not "
        "run, whatever the misfire policy; at least the misfire grace. Empty: no window.",
    )
    # Decided when a run ends (policies.plan_after_success); the database defaults keep an
    # older release's rows, during a rolling deploy, at today's behaviour.
    overlap = models.CharField(
        max_length=16,
        choices=Overlap.choices,
        default=Overlap.BUFFER_ONE,
        db_default=Overlap.BUFFER_ONE,
        help_text="What becomes of occurrences that come due while a run of this job is in "
        "flight (decided when it ends).",
    )
    max_buffer = models.IntegerField(
        default=100,
        db_default=100,
        help_text="buffer_all: at most this many of them run after the run in flight (the "
        "most recent); older ones are dropped and recorded.",
    )
    max_concurrent = models.IntegerField(
        default=10,
        db_default=10,
        help_text="allow_all: at most this many runs of the job in flight at once; an "
        "occurrence waits for a slot (then the misfire policy applies).",
    )
    # cancel_other / terminate_other: when the run in flight is to be cancelled (the next
    # occurrence, set by the claim), and whether it was (by a beat, which revoked its task).
    supersede_at = models.DateTimeField(null=True, blank=True, editable=False)
    superseded = models.BooleanField(default=False, db_default=False, editable=False)
    fixed_delay = models.BooleanField(
        default=False,
        db_default=False,
        help_text="An interval counted from the end of each run (a fixed delay between runs) "
        "rather than from its first occurrence (a fixed rate).",
    )

    # A calendar the job follows (schedapp.calendars): every path that sets next_run_at asks
    # it (policies.next_run). PROTECT: a calendar a job follows cannot be deleted.
    calendar = models.ForeignKey(
        "Calendar",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="jobs",
        db_index=False,  # a partial index: most jobs follow none (Meta.indexes)
        # No database constraint: PostgreSQL's is deferred, a trigger event queued for every
        # job inserted (a COPY of a million) and pending until commit, which also stops a
        # migration from altering the table after writing rows. PROTECT is the ORM's (the API,
        # the admin); a calendar deleted behind its back quarantines its jobs (the beat).
        db_constraint=False,
        help_text="A calendar this job follows: its exclusions, or its only allowed windows.",
    )
    calendar_mode = models.CharField(
        max_length=8,
        choices=CalendarMode.choices,
        default=CalendarMode.EXCLUDE,
        db_default=CalendarMode.EXCLUDE,
        help_text="exclude: never run inside the calendar; only: run only inside it.",
    )
    calendar_roll = models.CharField(
        max_length=24,
        choices=CalendarRoll.choices,
        default=CalendarRoll.SKIP,
        db_default=CalendarRoll.SKIP,
        help_text="An occurrence the calendar excludes: skipped, moved to the next or previous "
        "business day, or deferred to the end of the exclusion.",
    )
    # Deadlines (docs/semantics.md, Deadlines; schedapp.deadlines records their breaches).
    # NULL: none; the defaults come from SCHEDAPP_DEADLINES.
    start_deadline = models.DurationField(
        null=True,
        blank=True,
        default=_default_start_deadline,
        help_text="An occurrence not started this long after its time is late.",
    )
    skip_late = models.BooleanField(
        default=_default_skip_late,
        db_default=False,
        help_text="An occurrence found past its start deadline by the claim is not run: it is "
        "recorded as late (Kubernetes' startingDeadlineSeconds).",
    )
    max_runtime = models.DurationField(
        null=True,
        blank=True,
        default=_default_max_runtime,
        help_text="A run still going this long after it started is overrunning.",
    )
    revoke_overrun = models.BooleanField(
        default=_default_revoke_overrun,
        db_default=False,
        help_text="Revoke an overrunning run (terminated on a prefork worker).",
    )
    finish_by = models.TimeField(
        null=True,
        blank=True,
        default=_default_finish_by,
        help_text="Wall-clock time in the job's zone by which the day's occurrence must have "
        "succeeded.",
    )
    alert_after_failures = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=_default_alert_after_failures,
        help_text="This many failed attempts in a row make the job failing.",
    )
    # The next finish_by instant to look at (database time), set by the beats' deadline pass;
    # NULL: not armed yet (a new job, or finish_by changed).
    finish_by_at = models.DateTimeField(null=True, blank=True, editable=False)

    # When the next attempt is due (occurrence + jitter, or now + backoff), and the occurrence
    # it belongs to: recurring jobs compute the next occurrence from it, so there is no drift.
    next_run_at = models.DateTimeField(null=True, blank=True)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    # The occurrence a person added ("run now"): while scheduled_for is this time, the claim
    # records its runs as manual. Compared in the database only, never reset: once the job
    # moves on to another occurrence the two differ.
    manual_at = models.DateTimeField(null=True, blank=True)
    retry_count = models.PositiveIntegerField(default=0)
    missed_runs = models.PositiveBigIntegerField(default=0)
    failed_occurrences = models.PositiveBigIntegerField(
        default=0,
        db_default=0,
        help_text="Occurrences that failed with their retries spent (the job then went dead, "
        "or on to its next occurrence).",
    )

    # The lease; only schedapp.lease writes these.
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    token = models.BigIntegerField(default=0, help_text="Fencing token, +1 on every claim.")
    # When the current claim was made (database time), written by the claim alone: a run
    # starts after its claim, so a job claimed less than its max_runtime ago cannot be
    # overrunning (the deadline pass's bound; renewals, edits and reschedules never move it).
    # NULL: claimed by a release before 0044.
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    unstarted_dispatches = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="Times in a row the current attempt was sent and no worker started it within "
        "its lease; each new copy waits twice as long (schedapp.policies.dispatch_wait).",
    )

    source = models.CharField(
        max_length=16,
        choices=JobSource.choices,
        default=JobSource.API,
        help_text="Who created the job; declared jobs are kept in sync with the code.",
    )
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_status = models.CharField(max_length=16, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The due slice: the claim walks it per priority level, earliest first.
            models.Index(
                fields=["priority", "next_run_at"],
                name="schedapp_job_due",
                condition=Q(state="scheduled"),
            ),
            # Leases that may have expired (a paused job's run in flight holds one too).
            models.Index(
                fields=["lease_expires_at"],
                name="schedapp_job_leased",
                condition=Q(state__in=["running", "paused"]),
            ),
            models.Index(fields=["state", "task"], name="schedapp_job_state_task"),
            # The jobs following a calendar (its delete's PROTECT check; 0030, CONCURRENTLY).
            models.Index(
                fields=["calendar"],
                name="schedapp_job_calendar",
                condition=Q(calendar__isnull=False),
            ),
            # Runs in flight a later occurrence is to cancel (cancel_other, terminate_other).
            models.Index(
                fields=["supersede_at"],
                name="schedapp_job_supersede",
                condition=Q(supersede_at__isnull=False),
            ),
            # The deadline pass (schedapp.deadlines): only jobs with that deadline are looked at;
            # per distinct start deadline, those whose occurrence is older than it (a range).
            models.Index(
                fields=["start_deadline", "scheduled_for"],
                name="schedapp_job_late",
                condition=Q(start_deadline__isnull=False, state__in=["scheduled", "running"]),
            ),
            # The overrun look (0044): the smallest max runtime of the running jobs, then those
            # claimed longer ago than it. Only the job row, which the claim rewrites anyway:
            # the run rows' door and completion updates stay heap-only.
            models.Index(
                fields=["max_runtime"],
                name="schedapp_job_runtimes",
                condition=Q(max_runtime__isnull=False, state="running"),
            ),
            models.Index(
                fields=["claimed_at"],
                name="schedapp_job_overrun",
                condition=Q(max_runtime__isnull=False, state="running"),
            ),
            models.Index(
                fields=["finish_by_at"],
                name="schedapp_job_finish_by",
                condition=Q(finish_by__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="schedapp_job_name_unique"),
            models.CheckConstraint(
                name="schedapp_job_one_schedule",
                condition=(
                    Q(run_at__isnull=False, cron="", interval__isnull=True, solar_event="")
                    | (Q(run_at__isnull=True, interval__isnull=True, solar_event="") & ~Q(cron=""))
                    | Q(run_at__isnull=True, cron="", interval__isnull=False, solar_event="")
                    | (
                        Q(run_at__isnull=True, cron="", interval__isnull=True)
                        & ~Q(solar_event="")
                        & Q(latitude__isnull=False, longitude__isnull=False)
                    )
                ),
                violation_error_message="A job needs exactly one of run_at, cron, interval "
                "or solar_event (with latitude and longitude).",
            ),
            models.CheckConstraint(
                name="schedapp_job_schedulable_has_next",
                condition=~Q(state="scheduled") | Q(next_run_at__isnull=False),
                violation_error_message="A scheduled job needs next_run_at.",
            ),
            models.CheckConstraint(
                name="schedapp_job_positive_lease", condition=Q(lease_seconds__gte=1)
            ),
            models.CheckConstraint(
                name="schedapp_job_priority_range",
                condition=Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY),
                violation_error_message=f"priority must be {MIN_PRIORITY} to {MAX_PRIORITY}.",
            ),
            *_value_constraints(),
        ]
        permissions = [
            ("run_job", "Can run a job now"),
            ("pause_job", "Can pause and resume a job"),
            ("cancel_job", "Can cancel a job"),
            ("requeue_job", "Can requeue a dead job"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def schedule(self) -> Schedule:
        """The job's schedule, as stored (validated when it was written)."""
        return schedule_of(self.__dict__)

    @property
    def schedule_kind(self) -> str:
        if self.run_at is not None:
            return "once"
        if self.solar_event:
            return "solar"
        return "cron" if self.cron else "interval"

    @property
    def is_recurring(self) -> bool:
        return self.run_at is None


def field_default(name: str) -> Any:
    """A job field's default, as a new job would get it (several read SCHEDAPP_* settings)."""
    return Job._meta.get_field(name).get_default()  # type: ignore[union-attr]


def schedule_of(fields: Mapping[str, Any]) -> Schedule:
    """The schedule of a job's stored fields (a model's ``__dict__``, a row read as a dict):
    its kind, Celery's day rule and the DST policy for a cron, and its [not_before,
    expires_at] window."""
    run_at = fields.get("run_at")
    if run_at is not None:
        return Once(run_at.astimezone(UTC))
    schedule: Schedule
    if fields.get("cron"):
        day_or = fields.get("cron_day_or", True)
        policy = fields.get("dst_policy") or DEFAULT_DST_POLICY
        schedule = parse_cron(  # cached
            fields["cron"], fields["timezone"], day_or=day_or, dst_policy=policy
        )
    elif fields.get("solar_event"):
        schedule = Solar(fields["solar_event"], fields["latitude"], fields["longitude"])
    else:
        interval = fields.get("interval")
        if interval is None:
            raise ValueError("a job needs one schedule: run_at, cron, interval or solar")
        schedule = Interval(interval, fields.get("interval_anchor"))
    return with_window(schedule, fields.get("not_before"), fields.get("expires_at"))


class RunKind(models.TextChoices):
    """Why a run exists, recorded by the claim (``current_run().kind``, the timeline)."""

    SCHEDULED = "scheduled", "Scheduled"  # an occurrence of the schedule, first attempt
    RETRY = "retry", "Retry"  # a later attempt of an occurrence that failed
    MANUAL = "manual", "Manual"  # an occurrence a person added (run now)
    BACKFILL = "backfill", "Backfill"  # an occurrence of a backfill's range, every attempt


class RunStatus(models.TextChoices):
    DISPATCHED = "dispatched", "Dispatched"  # claimed and published, not started yet
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    LOST = "lost", "Lost"  # lease expired (worker or beat died, or publish failed)
    SKIPPED = "skipped", "Skipped"  # delivered with a stale token: not executed
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_RUN_STATUSES = (RunStatus.DISPATCHED, RunStatus.RUNNING)


class JobRun(models.Model):
    # No index of its own: the unique (job, token) index serves lookups by job.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="runs", db_index=False)
    token = models.BigIntegerField()
    attempt = models.PositiveIntegerField(default=1)
    # NULL for runs claimed before 0027 (or by an older release's beat during a rolling
    # deploy): schedapp.explain then derives it as before.
    kind = models.CharField(  # noqa: DJ001 (NULL: not recorded, unlike any kind)
        max_length=9, choices=RunKind.choices, null=True, blank=True
    )
    scheduled_for = models.DateTimeField(help_text="The occurrence this run is for.")
    due_at = models.DateTimeField(help_text="When it became due: occurrence + jitter/backoff.")
    claimed_by = models.CharField(max_length=200, blank=True, default="", help_text="Beat id.")
    dispatched_at = models.DateTimeField(
        help_text="Claimed for dispatch (database time); published right after that commit."
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeats = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True, default="")
    # Which admission at a worker's door started this run: a retried door write (its commit
    # landed, its reply was lost) recognises its own admission instead of refusing it.
    admission = models.CharField(max_length=32, blank=True, default="")
    task_id = models.CharField(max_length=255)
    status = models.CharField(
        max_length=16, choices=RunStatus.choices, default=RunStatus.DISPATCHED
    )
    stale = models.BooleanField(
        default=False, help_text="Finished after its lease was lost: not applied to the job."
    )
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    # A run with a lease of its own (overlap policy allow_all): the door, renewals, its
    # completion and the reaper decide on this row, not on the job's lease. The lease is set
    # while the run is in flight and cleared when it ends, so the partial indexes below hold
    # only runs in flight. Only schedapp.lease writes these.
    own_lease = models.BooleanField(default=False, db_default=False, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # A retry of an allow_all occurrence waiting for its due time (a run of its own: the
    # occurrence's scheduled_for and idempotency key, the next attempt): set while it waits,
    # cleared when a beat claims it. The job's own row cannot hold it: it moved on.
    retry_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-id"]
        constraints = [
            # One run per claim: a double dispatch of the same claim cannot be recorded.
            models.UniqueConstraint(fields=["job", "token"], name="schedapp_run_job_token")
        ]
        indexes = [
            models.Index(fields=["task_id"], name="schedapp_run_task_id"),
            models.Index(fields=["job", "-id"], name="schedapp_run_job_recent"),
            # The runs of one occurrence ("did 08:00 run?", a backfill's range), however long
            # the job's history. scheduled_for is written once, at insert (migration 0050).
            models.Index(fields=["job", "scheduled_for"], name="schedapp_run_occurrence"),
            # Pruning walks this. Nothing indexes a column that admission or completion
            # writes (status, started_at, finished_at...): those updates stay heap-only, in
            # the room the table's fillfactor leaves (migration 0005).
            models.Index(fields=["dispatched_at"], name="schedapp_run_dispatched"),
            # Runs in flight under a lease of their own: counted per job against
            # max_concurrent by the claim, and their expiries found by the reaper. Only
            # lease_expires_at is indexed (set on allow_all runs only), so the other runs'
            # admission and completion updates stay heap-only.
            models.Index(
                fields=["job", "lease_expires_at"],
                name="schedapp_run_in_flight",
                condition=Q(lease_expires_at__isnull=False),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="schedapp_run_leased",
                condition=Q(lease_expires_at__isnull=False),
            ),
            # Retries of allow_all occurrences waiting for their due time: the beat's claim.
            models.Index(
                fields=["retry_at"],
                name="schedapp_run_retry_due",
                condition=Q(retry_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.token} {self.status}"

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.scheduled_for)

    @property
    def duration(self) -> timedelta | None:
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None


class Fate(models.TextChoices):
    """Why an occurrence did not run (``schedapp.policies`` names them)."""

    MISFIRED = "misfired", "Misfired (found late; the misfire policy ran another or none)"
    OUTSIDE_WINDOW = "outside_window", "Outside the catch-up window"
    PAUSED = "paused", "Passed while paused"
    CANCELLED = "cancelled", "Job cancelled"
    QUARANTINED = "quarantined", "Job quarantined"
    OVERLAPPED = "overlapped", "Overlapped a run in flight (overlap policy skip)"
    BUFFER_FULL = "buffer_full", "Dropped from a full buffer (overlap policy buffer_all)"
    EXCLUDED = "excluded", "Excluded by the job's calendar"
    MERGED = "merged", "Merged by the job's calendar into a run moved onto or over it"
    LATE = "late", "Past its start deadline when found (skip_late)"


assert tuple(Fate.values) == FATES


class Occurrence(models.Model):
    """Occurrences of a job that did not run, and why: one row per decision, written in the
    transaction that made it, a range with its exact count (a job back after a year of
    minutes is one row, not half a million). An occurrence that ran is its runs instead
    (``JobRun`` rows with its ``scheduled_for``); ``schedapp.explain`` reads both as one
    ledger. Unique by its first occurrence: a decision made twice keeps the first record.

    On PostgreSQL the table is partitioned by range of id (migration 0048, as the runs are;
    ``schedapp.partitions``) so that retention drops whole partitions; SQLite keeps one
    table. The unique (job, scheduled_for) is then an index per partition: a decision repeated
    across a partition boundary can write a second record, which the readers leave out
    (``ledger.first_records``: the lowest id counts)."""

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="occurrences", db_index=False
    )
    scheduled_for = models.DateTimeField(help_text="The first occurrence of the range.")
    last = models.DateTimeField(help_text="The last occurrence of the range (included).")
    count = models.PositiveBigIntegerField(default=1, help_text="Occurrences in the range.")
    fate = models.CharField(max_length=16, choices=Fate.choices)
    detail = models.TextField(blank=True, default="")
    decided_by = models.CharField(
        max_length=200, blank=True, default="", help_text="The beat, or who acted."
    )
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "scheduled_for"], name="schedapp_occurrence_job_time"
            ),
            models.CheckConstraint(
                name="schedapp_occurrence_range",
                condition=Q(last__gte=models.F("scheduled_for"), count__gte=1),
            ),
        ]
        indexes = [models.Index(fields=["recorded_at"], name="schedapp_occurrence_recorded")]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.scheduled_for:%Y-%m-%d %H:%M:%S} x{self.count} {self.fate}"


class BackfillState(models.TextChoices):
    RUNNING = "running", "Running"
    CANCELLED = "cancelled", "Cancelled"
    DONE = "done", "Done"


class BackfillFate(models.TextChoices):
    """What a backfill decided for an occurrence of its range (``schedapp.lease.backfill``)."""

    DISPATCHED = "dispatched", "Ran (a run of kind backfill)"
    ALREADY_DONE = "already_done", "Not run: it already has a succeeded run"
    IN_FLIGHT = "in_flight", "Not run: a run of it was in flight"
    OVERLAPPED = "overlapped", "Not run: a run of the job was in flight (overlap skip)"
    CANCELLED = "cancelled", "Not run: cancelled with the backfill"


class Backfill(models.Model):
    """Occurrences of a job's schedule in [start, end] run as if their time had just passed.
    The beats advance it in their ticks, one at a time (the row locked, SKIP LOCKED), each
    batch's runs created in the transaction that moves ``cursor`` past them: a beat that
    dies mid-batch loses nothing. Throttled by a token bucket in database time
    (``allowance`` refilled at ``max_per_second`` since ``refilled_at``, at most one
    second's worth)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="backfills")
    start = models.DateTimeField()
    end = models.DateTimeField()
    overlap = models.CharField(max_length=16, default="allow_all")
    max_per_second = models.FloatField(default=10.0)
    rerun = models.BooleanField(default=False)
    state = models.CharField(
        max_length=16, choices=BackfillState.choices, default=BackfillState.RUNNING
    )
    # The last occurrence decided (None: none yet): the next starts strictly after it.
    cursor = models.DateTimeField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0, help_text="Occurrences in the range.")
    decided = models.PositiveIntegerField(default=0)
    dispatched = models.PositiveIntegerField(default=0)
    already_done = models.PositiveIntegerField(default=0)
    in_flight = models.PositiveIntegerField(default=0)
    overlapped = models.PositiveIntegerField(default=0)
    cancelled_count = models.PositiveIntegerField(default=0)
    allowance = models.FloatField(default=0.0)
    refilled_at = models.DateTimeField(db_default=Now())
    created_by = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["id"], name="schedapp_backfill_running", condition=Q(state="running")
            )
        ]
        constraints = [
            models.CheckConstraint(
                name="schedapp_backfill_range", condition=Q(end__gt=models.F("start"))
            ),
            models.CheckConstraint(
                name="schedapp_backfill_rate", condition=Q(max_per_second__gt=0)
            ),
        ]

    def __str__(self) -> str:
        return f"backfill {self.pk} of job {self.job_id} ({self.decided}/{self.total})"

    @property
    def progress(self) -> float:
        """Occurrences decided, as a fraction of the range (1.0 for an empty one)."""
        return self.decided / self.total if self.total else 1.0


class BackfillRange(models.Model):
    """The fates of a backfill's occurrences, in order, consecutive ones alike as one range
    with its count (a backfill of 10,000 that ran them all is one row)."""

    backfill = models.ForeignKey(Backfill, on_delete=models.CASCADE, related_name="ranges")
    first = models.DateTimeField()
    last = models.DateTimeField()
    count = models.PositiveIntegerField(default=1)
    fate = models.CharField(max_length=16, choices=BackfillFate.choices)

    class Meta:
        ordering = ["backfill", "first"]

    def __str__(self) -> str:
        return f"{self.first:%Y-%m-%d %H:%M:%S} x{self.count} {self.fate}"


class BreachKind(models.TextChoices):
    """What a job's deadline breach is (``schedapp.deadlines``)."""

    LATE = "late", "Late (not started within its start deadline)"
    OVERRUNNING = "overrunning", "Overrunning (running past its max runtime)"
    MISSED_FINISH_BY = "missed_finish_by", "Missed its finish-by time"
    FAILING = "failing", "Failing (failed attempts in a row)"
    DEAD = "dead", "Dead (retries exhausted)"


class Breach(models.Model):
    """One incident of a job missing a deadline (or going dead), recorded with the occurrence
    it concerns, and cleared when it ends. At most one open breach per job and kind: a
    second detection of an incident still open, by this beat or another, cannot be recorded
    (the partial unique constraint, not a Python check, decides)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="breaches", db_index=False)
    kind = models.CharField(max_length=16, choices=BreachKind.choices)
    scheduled_for = models.DateTimeField(
        help_text="The occurrence it concerns (for finish_by: the deadline instant)."
    )
    opened_at = models.DateTimeField(db_default=Now())
    cleared_at = models.DateTimeField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")
    cleared_detail = models.TextField(blank=True, default="")
    # An overrun schedapp revoked (revoke_overrun): the run was killed on purpose, so the
    # breach clears at once; its recovery never withdraws the alert (deadlines._notify).
    revoked = models.BooleanField(
        default=False,
        db_default=False,
        editable=False,
        help_text="schedapp revoked the overrunning run (revoke_overrun): its recovery "
        "never withdraws the alert.",
    )

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            # Also the index of open breaches: what the deadline pass clears, the gauge counts.
            models.UniqueConstraint(
                fields=["job", "kind"],
                condition=Q(cleared_at__isnull=True),
                name="schedapp_breach_open_once",
            )
        ]
        indexes = [
            # A job's breaches on its timeline.
            models.Index(fields=["job", "scheduled_for"], name="schedapp_breach_job"),
            # The "needs attention" page: a kind's open breaches, newest first, a page at a
            # time, and each kind counted up to a cap (only open rows: never the history).
            models.Index(
                fields=["kind", "opened_at", "id"],
                name="schedapp_breach_open_kind",
                condition=Q(cleared_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} @{self.scheduled_for:%Y-%m-%d %H:%M:%S}"


class Attention(Breach):
    """The open breaches as the admin's "needs attention" page (``schedapp.admin.attention``):
    a proxy, so that the page is listed on the admin index like a model, with no table of
    its own."""

    class Meta:
        proxy = True
        verbose_name = "needs attention"
        verbose_name_plural = "needs attention"


class JobChange(models.Model):
    """One change to a job by a person or a process: who, from where, when, why, and what
    changed (its fields before and after). Written by ``schedapp.audit`` in the transaction
    that makes the change, for every path that changes a job (the API and so the admin,
    declared jobs and the importer; ``schedule_many``; the admin's delete). No foreign key:
    the trail of a deleted job outlives it."""

    class Action(models.TextChoices):
        CREATED = "created", "Created"
        UPDATED = "updated", "Changed"
        PAUSED = "paused", "Paused"
        RESUMED = "resumed", "Resumed"
        RUN_NOW = "run_now", "Run now"
        REQUEUED = "requeued", "Requeued"
        CANCELLED = "cancelled", "Cancelled"
        RESTORED = "restored", "Restored to an earlier version"
        DELETED = "deleted", "Deleted"
        BACKFILL = "backfill", "Backfill started"
        BACKFILL_CANCEL = "backfill_cancel", "Backfill cancelled"

    job_id = models.BigIntegerField()
    job_name = models.CharField(max_length=200)
    at = models.DateTimeField(db_default=Now())
    action = models.CharField(max_length=16, choices=Action.choices)
    source = models.CharField(
        max_length=16, help_text="The path: api, admin, declared, imported or bulk."
    )
    actor = models.CharField(
        max_length=200, help_text="The user, or the process and host that made the change."
    )
    reason = models.TextField(blank=True, default="")
    # {field: [before, after]} of the job's own fields (fields.JOB_FIELDS), JSON-encoded.
    # NULL for a creation: what it created is the job's first version, which
    # schedapp.audit.version_values reads back from the job and the changes after it.
    changes = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["job_id", "at"], name="schedapp_jobchange_job")]

    def __str__(self) -> str:
        return f"{self.job_name} {self.action} by {self.actor} at {self.at:%Y-%m-%d %H:%M:%S}"


class Node(models.Model):
    """A beat or worker process seen recently; each refreshes its row while it lives."""

    class Kind(models.TextChoices):
        BEAT = "beat", "Beat"
        WORKER = "worker", "Worker"

    name = models.CharField(max_length=255, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stats = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["kind", "name"]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


class OnceKey(models.Model):
    """Idempotency keys recorded by ``@schedapp.once`` in the task's own transaction."""

    key = models.CharField(max_length=255, unique=True)
    job_id = models.BigIntegerField(null=True)
    run_id = models.BigIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key


class DeclarationSet(models.Model):
    """One release's declared jobs as a whole: its ``SCHEDAPP_RELEASE`` and a fingerprint of
    the declarations. Which of two sets is newer decides whose declaration a job keeps in a
    rolling deploy (``schedapp.declared.newer``): the release first, then which set the
    database saw first."""

    release = models.CharField(max_length=200, blank=True, default="")
    fingerprint = models.CharField(max_length=64)
    first_seen = models.DateTimeField(help_text="Database clock, when a beat first synced it.")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["release", "fingerprint"], name="schedapp_declarationset_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.release or 'no release'} {self.fingerprint[:12]}"


class Declaration(models.Model):
    """What the newest declaration set that synced a job name said about it: the sync of an
    older set leaves that name alone. Kept out of the job table (the hot table), read and
    locked only by the sync."""

    name = models.CharField(max_length=200)  # unique through a constraint, as Job.name
    # None: no set has decided on this name yet (a row made to lock on).
    declaration_set = models.ForeignKey(
        DeclarationSet, null=True, on_delete=models.PROTECT, related_name="+"
    )
    declared = models.BooleanField(default=False)  # False: that set no longer declares it
    # The sync paused the job because a set stopped declaring it, and no person paused or
    # resumed it since: a set that declares it again resumes it.
    withdrawn = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name"], name="schedapp_declaration_name_unique")
        ]

    def __str__(self) -> str:
        return self.name


class Calendar(models.Model):
    """A named calendar: the days and times a business does not run, as a JSON definition
    (``schedapp.calendars`` reads it: holidays by country, dates, weekdays, time ranges, cron
    exclusions, union and difference, references to other calendars by name). Holidays are
    computed on demand from the ``holidays`` package, never stored. ``references`` mirrors the
    definition's ``{"calendar": name}`` rules, so a calendar another refers to cannot be
    deleted (PROTECT) and a cycle is refused on save (``schedapp.validation``)."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    definition = models.JSONField(
        help_text='One rule, e.g. {"union": [{"holidays": {"country": "DE"}}, '
        '{"weekdays": ["sat", "sun"]}]}.'
    )
    references = models.ManyToManyField(
        "self", symmetrical=False, through="CalendarReference", related_name="referenced_by"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name


class CalendarReference(models.Model):
    """One calendar's definition naming another: the other is kept while it is named."""

    calendar = models.ForeignKey(Calendar, on_delete=models.CASCADE, related_name="+")
    target = models.ForeignKey(Calendar, on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["calendar", "target"], name="schedapp_calendarreference_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.calendar_id} -> {self.target_id}"


class Notification(models.Model):
    """One event a channel is to tell a team about: the transactional outbox. Written by
    ``schedapp.notify.enqueue`` in the transaction that records the event (it exists iff the
    event committed); sent, grouped with the channel's other pending events, by a delivery
    loop (``schedapp.notify.delivery``) after that commit. No foreign key: the job's name and
    tags are a snapshot, and the record outlives the job."""

    class Kind(models.TextChoices):
        LATE = "late", "Late"
        OVERRUNNING = "overrunning", "Overrunning"
        MISSED_FINISH_BY = "missed_finish_by", "Missed finish_by"
        FAILING = "failing", "Failing"
        DEAD = "dead", "Dead"
        RECOVERED = "recovered", "Recovered"

    channel = models.CharField(max_length=64)
    kind = models.CharField(max_length=24, choices=Kind.choices)
    job_id = models.BigIntegerField(null=True, blank=True)
    job_name = models.CharField(max_length=200)
    tags = models.JSONField(default=list, blank=True)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")
    # What makes two events one alert: while one is unsent, another for the same channel
    # and incident adds nothing (the unique indexes below). Empty: an incident of its own.
    incident = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    attempts = models.IntegerField(default=0)
    # NULL until a delivery failed: then the earliest next try (the channel's backoff).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            # What a delivery loop reads: a channel's pending events, oldest first.
            models.Index(
                fields=["channel", "id"],
                name="schedapp_notification_pending",
                condition=Q(sent_at__isnull=True, failed_at__isnull=True),
            ),
            # A recovery looks up its incident's last alert.
            models.Index(
                fields=["incident", "channel"],
                name="schedapp_notification_incident",
                condition=~Q(incident=""),
            ),
            # Deliveries that failed for good, newest first (the "needs attention" page).
            models.Index(
                fields=["failed_at", "id"],
                name="schedapp_notification_failed",
                condition=Q(failed_at__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "incident"],
                name="schedapp_notification_one_alert",
                condition=Q(sent_at__isnull=True, failed_at__isnull=True)
                & ~Q(incident="")
                & ~Q(kind="recovered"),
            ),
            models.UniqueConstraint(
                fields=["channel", "incident"],
                name="schedapp_notification_one_recovery",
                condition=Q(sent_at__isnull=True, failed_at__isnull=True, kind="recovered")
                & ~Q(incident=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.job_name} -> {self.channel}"


class NotificationChannel(models.Model):
    """A channel's delivery state, one row per configured channel: the row a delivery loop
    locks (SKIP LOCKED) so that one loop at a time sends a channel's messages, when it last
    sent one (the group interval counts from it) and its failures in a row (the backoff)."""

    name = models.CharField(max_length=64, primary_key=True)
    last_message_at = models.DateTimeField(null=True, blank=True)
    failures = models.IntegerField(default=0)
    retry_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "Attention",
    "Breach",
    "BreachKind",
    "Calendar",
    "CalendarReference",
    "Declaration",
    "DeclarationSet",
    "DstPolicy",
    "Fate",
    "Job",
    "JobRun",
    "JobSource",
    "JobState",
    "MisfirePolicy",
    "Node",
    "Notification",
    "NotificationChannel",
    "Occurrence",
    "OnceKey",
    "RunStatus",
    "idempotency_key",
    "parse_task_id",
    "schedule_of",
    "task_id_for",
]
