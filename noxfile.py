"""Test sessions over the supported dependency ranges, and the package checks.

    nox -s matrix     # the full matrix, one session after another (docs/development.md has
                      # its last table of results)
    nox -s ci         # the fast subset CI runs (.ci/run)
    nox -s wheel      # build sdist + wheel, twine check, the wheel alone in a clean venv
    nox -l            # every session

Each matrix session installs schedapp with its test extras and pins Django, Celery and kombu
to the newest patch release of one minor version, then runs the unit and integration tests
(not e2e: those start real beats and workers, and the main suite runs them). The ranges'
lowest and highest minors are crossed; every supported Python is in at least one session, and
Django 6.x only where it installs (Python 3.12 and later). Sessions need PostgreSQL and Redis as
the main suite does; DATABASE_TEST_NAME / CELERY_BROKER_URL are passed through.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
nox.options.sessions = ["ci"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True


def _find_interpreters() -> None:
    """Interpreters pyenv installed but did not put on PATH (no `pyenv global` for them)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    extra = []
    for version in ("3.11", "3.12", "3.13"):
        found = shutil.which(f"python{version}")
        if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
            continue
        extra += sorted(glob.glob(f"{root}/versions/{version}.*/bin"))[-1:]
    if extra:
        os.environ["PATH"] = os.pathsep.join([*extra, os.environ.get("PATH", "")])


_find_interpreters()

# (python, Django, Celery and kombu): lowest and highest minors of each range, crossed.
MATRIX = [
    ("3.11", "5.2", "5.4"),  # every lowest
    ("3.11", "5.2", "5.7"),
    ("3.12", "6.1", "5.4"),  # Django 6's lowest Python
    ("3.13", "5.2", "5.4"),
    ("3.13", "6.1", "5.7"),  # every highest
]
CI = ("3.13", "6.1", "5.4")  # what the main suite (Python 3.11, Django 5.2, Celery 5.7) is not

# The fast subset for CI (its additions to .ci/run stay under two minutes): the system checks,
# schedapp without its extras, the public API on PostgreSQL, which touches Django's ORM and
# Celery's app the most, and the admin's pages, which extend the installed Django's admin
# templates (6.1 writes its breadcrumbs as a list where 5.2 wrote a div; the main suite runs
# 5.2). The admin's 92 tests add 15 s: the subset took 28 s here, 13 s without them.
CI_TESTS = [
    "tests/unit/test_system_checks.py",
    "tests/unit/test_optional_dependencies.py",
    "tests/integration/test_api.py",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/integration/test_admin*.py")),
]
PASSTHROUGH = ("DATABASE_URL", "DATABASE_TEST_NAME", "CELERY_BROKER_URL")


# Test-only packages that do not install beside a Django minor yet; the tests that need them
# skip (django-celery-beat 2.9 requires Django<6.1: the importer's table test skips there).
NOT_WITH_DJANGO = {"6.1": ("django-celery-beat",)}


def _test_requirements(django: str) -> list[str]:
    """The `test` extra of pyproject.toml, less what cannot install with this Django."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    left_out = NOT_WITH_DJANGO.get(django, ())
    return [r for r in extra if not r.startswith(("schedapp[", *left_out))]


def _install(session: nox.Session, django: str, celery: str) -> None:
    session.install(
        "-e",
        ".[all,demo]",
        *_test_requirements(django),
        f"Django~={django}.0",
        f"celery~={celery}.0",
        f"kombu~={celery}.0",
    )
    session.run(
        "python",
        "-c",
        "import celery, django, kombu, sys; print('versions:', sys.version.split()[0], "
        "'Django', django.__version__, 'Celery', celery.__version__, 'kombu', kombu.__version__)",
    )


def _pytest(session: nox.Session, *paths: str) -> None:
    env = {k: os.environ[k] for k in PASSTHROUGH if k in os.environ}
    session.run("pytest", "-q", "-p", "no:cacheprovider", *paths, *session.posargs, env=env)


@nox.session(name="tests")
@nox.parametrize(
    "python,django,celery",
    [nox.param(*row, id=f"py{row[0]}-django{row[1]}-celery{row[2]}") for row in MATRIX],
)
def tests(session: nox.Session, django: str, celery: str) -> None:
    """Unit and integration tests on one combination."""
    _install(session, django, celery)
    _pytest(session, "tests/unit", "tests/integration")


@nox.session(python=False)
def matrix(session: nox.Session) -> None:
    """Every `tests` session, one after another (the machine is shared: never in parallel)."""
    failed = []
    for python, django, celery in MATRIX:
        name = f"tests(py{python}-django{django}-celery{celery})"
        try:
            session.run(
                sys.executable,
                "-m",
                "nox",
                "-f",
                str(ROOT / "noxfile.py"),
                "-s",
                name,
                external=True,
            )
        except nox.command.CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"failed: {', '.join(failed)}")


@nox.session(python=CI[0])
def ci(session: nox.Session) -> None:
    """The fast subset of the matrix for CI: the combination furthest from the main suite's."""
    _install(session, CI[1], CI[2])
    _pytest(session, *CI_TESTS)


@nox.session(python="3.11")
def wheel(session: nox.Session) -> None:
    """Build the sdist and wheel, check their metadata, and install the wheel alone (hard
    dependencies only) to import every module and run `django-admin check` on a tiny project."""
    dist = Path(session.create_tmp()).resolve() / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.install("build", "twine")
    session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT))
    artefacts = sorted(str(p) for p in dist.iterdir())
    session.run("twine", "check", "--strict", *artefacts)
    session.run("python", str(ROOT / ".ci" / "sdist_contents.py"), *artefacts)
    # A clean environment: nothing but the wheel and what it requires.
    clean = Path(session.create_tmp()).resolve() / "clean"
    shutil.rmtree(clean, ignore_errors=True)
    session.run("python", "-m", "venv", str(clean))
    bin_ = clean / "bin"
    wheel_file = next(a for a in artefacts if a.endswith(".whl"))
    session.run(str(bin_ / "pip"), "install", "-q", wheel_file, external=True)
    session.run(str(bin_ / "pip"), "check", external=True)
    project = ROOT / ".ci" / "tinyproject"
    env = {"PYTHONPATH": str(project), "DJANGO_SETTINGS_MODULE": "tiny.settings"}
    with session.chdir(clean):  # not the repository: schedapp must come from the wheel
        session.run(str(bin_ / "python"), str(project / "smoke.py"), env=env, external=True)
        session.run(
            str(bin_ / "django-admin"), "check", "--fail-level", "WARNING", env=env, external=True
        )
