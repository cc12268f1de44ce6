"""The standard Django + Celery layout: settings come from Django's, under CELERY_*."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The chaos check's proof that it catches defects: a defect of the first worker protocol put
# back on purpose (bench/defects.py). Never set outside the chaos runs and their tests.
if os.environ.get("CHAOS_DEFECT"):
    from bench.defects import install

    install(os.environ["CHAOS_DEFECT"])
