"""The sdist and wheel hold what they should: the package with its migrations, templates and
static files, its test kit (schedapp.testing), the license; no tests, demo project, benchmarks
or caches."""

import sys
import tarfile
import zipfile

must = [
    "schedapp/__init__.py",
    "schedapp/migrations/0001_initial.py",
    "schedapp/py.typed",
    "schedapp/templates/",
    "schedapp/static/",
    "schedapp/testing/fleet.py",
    "schedapp/testing/pgproxy/__main__.py",
]
never_top = ("tests/", "project/", "bench/", "var/", ".venv/", ".ci/")
for path in sys.argv[1:]:
    if path.endswith(".whl"):
        names = zipfile.ZipFile(path).namelist()
        must_here = [*must, "licenses/LICENSE"]
    else:
        names = [n.split("/", 1)[1] for n in tarfile.open(path).getnames() if "/" in n]
        must_here = [*must, "LICENSE", "CHANGELOG.md", "docs/pypi.md"]
    missing = [m for m in must_here if not any(m in n for n in names)]
    unwanted = [
        n for n in names if n.startswith(never_top) or "__pycache__" in n or n.endswith(".pyc")
    ]
    if missing or unwanted:
        sys.exit(f"{path}: missing {missing}, unwanted {unwanted[:10]}")
    print(f"{path}: {len(names)} files, contents as expected")
