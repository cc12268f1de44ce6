"""Optional dependencies: the module each extra brings, and whether it is installed.

schedapp imports none of these at module level without a guard, so the package imports and
runs without any of them; ``checks.check_dependencies`` reports each one that the
configuration needs but is missing, at ``manage.py check`` rather than as an ImportError deep
in a beat.
"""

from __future__ import annotations

import importlib

# module -> (extra that installs it, what needs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "psycopg": ("postgres", "PostgreSQL (psycopg 3: psycopg2 is not enough)"),
    "redis": ("redis", "Redis"),
    "prometheus_client": ("metrics", "Prometheus metrics"),
    "ephem": ("solar", "solar schedules"),
}


def installed(module: str) -> bool:
    """Whether ``module`` imports (an import, not a lookup: a broken install counts as
    missing)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def install_hint(module: str) -> str:
    extra, _ = EXTRAS[module]
    return f"pip install 'schedapp[{extra}]'"
