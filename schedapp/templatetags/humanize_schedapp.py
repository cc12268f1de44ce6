"""Template filters for the overview page (without requiring django.contrib.humanize)."""

from __future__ import annotations

from typing import Any

from django import template

from ..display import seconds_text

register = template.Library()


@register.filter
def thousands(value: Any) -> str:
    """12345 -> '12,345'."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "-"


@register.filter
def seconds(value: Any) -> str:
    """Seconds as '250 ms', '3.2 s' or '0:05:00'; '-' for none."""
    try:
        return seconds_text(None if value is None else float(value))
    except (TypeError, ValueError):
        return "-"


@register.filter
def node_stats(value: Any) -> str:
    """A node's stats as words, as the Nodes page says them ('active 2 · queues celery')."""
    from ..admin.runs import stats_text

    return stats_text(value if isinstance(value, dict) else None)
