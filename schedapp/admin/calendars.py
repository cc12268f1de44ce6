"""Calendars in the admin: the definition edited as JSON and checked by the API's own rules
(``validation.validate_calendar``), saved through ``api.save_calendar``'s steps, and the next
year's excluded days shown on the calendar's page."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from .. import api, calendars
from ..db import db_now
from ..exceptions import ScheduleError
from ..models import Calendar
from ..validation import validate_calendar

EXAMPLE = (
    '{"union": [{"holidays": {"country": "DE", "subdivision": "BY"}}, '
    '{"weekdays": ["sat", "sun"]}]}'
)


class CalendarForm(forms.ModelForm):
    """The definition as JSON text; every problem named by its path in the definition."""

    definition = forms.JSONField(
        widget=forms.Textarea(attrs={"rows": 12, "cols": 90, "style": "font-family:monospace"}),
        help_text=f"One rule, e.g. {EXAMPLE}. Rules: holidays (country, subdivision), dates, "
        "weekdays, time_range (start, end, weekdays; crossing midnight allowed), cron, union, "
        "difference, calendar (another calendar by name).",
    )

    class Meta:
        model = Calendar
        fields = ("name", "description", "definition")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            validate_calendar(
                data.get("name"),
                data.get("definition"),
                data.get("description") or "",
                instance=self.instance if self.instance.pk else None,
                today=db_now().date(),
            )
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                target = field if field in ("name", "description") else "definition"
                for message in messages:
                    text = message if target == field else f"{field}: {message}"
                    self.add_error(target, text)
        return data


class CalendarAdmin(admin.ModelAdmin):
    form = CalendarForm
    list_display = ("name", "description", "updated_at")
    search_fields = ("name",)
    readonly_fields = ("excluded_next_year", "updated_at")
    fields = ("name", "description", "definition", "excluded_next_year", "updated_at")

    def save_model(self, request: HttpRequest, obj: Calendar, form: Any, change: bool) -> None:
        """Through the API's checks and writes, under its lock (the form checked without it,
        to name each problem on its field)."""
        with transaction.atomic():
            api.serialise_calendar_saves()
            existing = Calendar.objects.select_for_update().get(pk=obj.pk) if change else None
            saved = api.write_calendar(existing, obj.name, obj.definition, obj.description)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at
        obj._state.adding = False

    @admin.display(description="Excluded days, next 12 months")
    def excluded_next_year(self, obj: Calendar) -> str:
        if obj.pk is None:
            return "Shown once the calendar is saved."
        try:
            parsed = calendars.parse_calendar(
                obj.name, obj.definition, api.stored_calendar_definition
            )
        except ScheduleError as exc:
            return f"Cannot be read: {exc}"
        first = db_now().date()
        return excluded_days_html(parsed.rule, first, first + timedelta(days=365))


def excluded_days_html(rule: calendars.Rule, first: date, last: date) -> str:
    """The wholly excluded days of [first, last], a line per month, and how many days hold a
    blackout window (part of the day excluded)."""
    months: dict[str, list[str]] = {}
    partial = 0
    day = first
    while day <= last:
        spans = rule.spans(day)
        if spans == calendars.FULL:
            months.setdefault(day.strftime("%Y-%m %b"), []).append(day.strftime("%a %d"))
        elif spans:
            partial += 1
        day += timedelta(days=1)
    total = sum(map(len, months.values()))
    rows = format_html_join(
        "",
        "<tr><th>{}</th><td>{}</td></tr>",
        ((month, ", ".join(days)) for month, days in months.items()),
    )
    return format_html(
        "<p>{} whole days excluded from {} to {}; {} more days have a blackout window.</p>"
        '<table class="schedapp-calendar-days">{}</table>',
        total,
        first.isoformat(),
        last.isoformat(),
        partial,
        rows,
    )
