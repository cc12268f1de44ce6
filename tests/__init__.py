"""The test suite. What the kit (``schedapp.testing``) needs to know of this repository: where
it is, which Celery app and which settings its real processes run."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = "project"  # celery -A project
SETTINGS = "project.settings_test"
