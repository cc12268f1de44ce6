"""A result backend for ``CELERY_RESULT_BACKEND``: django-celery-results' database backend,
retrying through a database restart.

Celery stores a task's result before it sends ``task_success``/``task_failure``; if that store
fails, the signals never fire and schedapp cannot record the run's outcome (its lease then
expires and the job runs again). django-celery-results retries only ``InterfaceError``; this
also retries ``OperationalError`` ("connection refused", "the connection is closed"), with
``CELERY_RESULT_BACKEND_ALWAYS_RETRY = True`` and a bounded ``..._MAX_RETRIES``.
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError, connection
from django_celery_results.backends.database import DatabaseBackend as _DatabaseBackend


class DatabaseBackend(_DatabaseBackend):
    def exception_safe_to_retry(self, exc: Exception) -> bool:
        if isinstance(exc, InterfaceError | OperationalError):
            connection.close()  # the next attempt opens a fresh connection
            return True
        return super().exception_safe_to_retry(exc)
