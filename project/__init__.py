"""The Django project and Celery app used by the demo and the tests."""

from .celery import app as celery_app

__all__ = ("celery_app",)
