"""The installed wheel, on its hard dependencies alone: it imports, migrates, schedules a job
and reports the extras it does not have as absent (not as an ImportError)."""

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

import django

django.setup()

import schedapp  # noqa: E402

where = Path(schedapp.__file__).resolve()
assert "site-packages" in where.parts, f"schedapp imported from {where}, not the wheel"
extras = ("psycopg", "redis", "prometheus_client", "ephem", "dj_database_url")
present = [name for name in extras if importlib.util.find_spec(name)]
assert not present, f"the wheel pulled in optional packages: {present}"

modules = [m.name for m in pkgutil.walk_packages(schedapp.__path__, "schedapp.")]
for name in modules:
    importlib.import_module(name)

from django.core.management import call_command  # noqa: E402

call_command("migrate", verbosity=0)

from schedapp import api, metrics  # noqa: E402

job = api.schedule("schedapp.prune_runs", cron="*/5 * * * *", name="smoke")
assert job.next_run_at is not None
metrics.claimed(1)  # a no-op without prometheus-client
print(
    f"schedapp {schedapp.__version__} from {where.parent}: {len(modules)} modules imported, "
    f"migrated, job {job.pk} scheduled; Python {sys.version.split()[0]}, "
    f"Django {django.__version__}"
)
