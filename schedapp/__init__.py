"""schedapp: a highly-available, database-backed replacement for Celery beat."""

from __future__ import annotations

from typing import Any

__all__ = ["RunInfo", "current_run", "once"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the package (INSTALLED_APPS does) loads no models.
    if name in __all__:
        from . import context

        return getattr(context, name)
    raise AttributeError(name)
