"""The test suite. What the kit (``schedapp.testing``) needs to know of this repository: where
it is, which Celery app and which settings its real processes run."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = "project"  # celery -A project
SETTINGS = "project.settings_test"


def examples(weight: int) -> int:
    """``max_examples`` for a property test: ``weight`` scaled by the active profile's
    ``max_examples`` over 100: a quarter of it under the default profile (the loop of minutes),
    five times it under ``ci`` (.ci/run: ``HYPOTHESIS_PROFILE=ci``).
    A test's own ``max_examples`` would otherwise override every profile."""
    from hypothesis import settings

    return max(1, weight * settings.default.max_examples // 100)

