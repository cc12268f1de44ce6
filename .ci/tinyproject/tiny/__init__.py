"""The smallest project that uses schedapp: the wheel's smoke test (noxfile.py, session wheel)."""

from .celery import app

__all__ = ["app"]
