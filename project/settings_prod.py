"""An example of production settings: everything secret or host-specific comes from the
environment, and ``python manage.py check --deploy`` is clean with it.

    DJANGO_SETTINGS_MODULE=project.settings_prod DJANGO_SECRET_KEY=... \\
    DJANGO_ALLOWED_HOSTS=scheduler.example.com DATABASE_URL=postgresql://... \\
    CELERY_BROKER_URL=redis://... python manage.py check --deploy
"""

import os

from django.core.exceptions import ImproperlyConfigured

from .settings import *  # noqa: F403

try:
    SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
except KeyError as exc:
    raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set in production.") from exc
for _name in ("DATABASE_URL", "CELERY_BROKER_URL"):
    if not os.environ.get(_name):
        raise ImproperlyConfigured(f"{_name} must be set in production (no embedded default).")

DEBUG = False
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",") if h]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
SECURE_HSTS_SECONDS = 31536000
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
X_FRAME_OPTIONS = "DENY"
# The metrics view (project/urls.py) answers only with this bearer token; without one,
# `check --deploy` warns (schedapp.W013).
SCHEDAPP_METRICS_TOKEN = os.environ.get("SCHEDAPP_METRICS_TOKEN") or None
# The nightly pruning job the demo settings declare, plus the project's own tasks.
SCHEDAPP_ALLOWED_TASKS = [
    "schedapp.prune_runs",
    *(p for p in os.environ.get("SCHEDAPP_ALLOWED_TASKS", "").split(",") if p),
]
