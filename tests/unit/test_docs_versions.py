"""The version facts a new user trips on are written where they read first: the README's and
the package page's supported versions, and the django-celery-beat migration, which its
pinned Django blocks on Django 6.1 (issue 29, item 13)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

import pytest

from tests import ROOT


def classifiers() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]


def supported_line(text: str) -> str:
    """The "Supported: ..." sentence, as one line."""
    flat = " ".join(text.split("Supported:", 1)[1].split())
    return re.split(r";|\.(?: |$)", flat, maxsplit=1)[0]


@pytest.mark.parametrize("page", ["README.md", "docs/pypi.md"])
def test_the_supported_versions_say_django_6_needs_python_3_12(page):
    # Given a package that supports Python 3.11 and Django 6.x, whose 6.x releases require
    # Python 3.12 or later (pip on 3.11 silently stays on 5.2)
    found = classifiers()
    assert "Programming Language :: Python :: 3.11" in found
    assert any(c.startswith("Framework :: Django :: 6.") for c in found)
    # Then the page's supported versions say so
    line = supported_line((ROOT / page).read_text())
    assert "Django 6.x needs Python 3.12+" in line, line


def migrating_from_django_celery_beat() -> str:
    doc = (ROOT / "docs" / "migrating.md").read_text()
    return " ".join(doc.split("## From django-celery-beat", 1)[1].split("\n## ", 1)[0].split())


def test_migrating_says_django_celery_beats_django_pin_and_the_way_around_it():
    section = migrating_from_django_celery_beat()
    assert "django-celery-beat 2.9 requires Django < 6.1" in section
    assert "before upgrading Django to 6.1" in section
    assert "pip install --no-deps 'django-celery-beat==2.9.*'" in section


def test_the_pin_migrating_names_is_the_installed_django_celery_beats():
    try:
        version = metadata.version("django-celery-beat")
    except metadata.PackageNotFoundError:
        pytest.skip("django-celery-beat is not installed (the Django 6.1 sessions)")
    if not version.startswith("2.9"):
        pytest.skip(f"django-celery-beat {version}: the doc describes 2.9")
    pins = [r for r in metadata.requires("django-celery-beat") or [] if r.startswith("Django")]
    assert any(re.search(r"<\s*6\.1", pin) for pin in pins), pins
