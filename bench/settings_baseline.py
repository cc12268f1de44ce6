"""Settings for the baselines: the test settings plus django-celery-beat's tables and RedBeat's
Redis. Used only by ``bench/`` (the baselines are a ``bench`` extra, never a dependency)."""

import os

from project.settings_test import *  # noqa: F403
from project.settings_test import INSTALLED_APPS

if "django_celery_beat" not in INSTALLED_APPS:  # the test settings add it when installed
    INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]

# RedBeat keeps its schedule in a Redis database of its own (the broker's is watched).
CELERY_REDBEAT_REDIS_URL = os.environ.get("BENCH_REDBEAT_URL", "redis://127.0.0.1:6379/13")
# django-celery-beat's default loop interval (5 s) for both baselines; RedBeat's lock follows.
CELERY_BEAT_MAX_LOOP_INTERVAL = 5
