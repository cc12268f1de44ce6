"""The suite's reset after a test that commits (tests/dbreset.py) leaves what Django's flush
leaves: every table empty but the content types and permissions ``post_migrate`` writes, and
those as it writes them, even after a test changed them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from schedapp import api
from schedapp.models import Job, JobRun
from tests import dbreset

pytestmark = pytest.mark.django_db(transaction=True)


def _filled() -> set[str]:
    with connection.cursor() as cursor:
        out = set()
        for table in dbreset._tables("default"):
            cursor.execute(f"SELECT 1 FROM {connection.ops.quote_name(table)} LIMIT 1")
            if cursor.fetchone():
                out.add(table)
        return out


def _post_migrate_rows() -> tuple[set, set]:
    return (
        set(ContentType.objects.values_list("app_label", "model")),
        set(Permission.objects.values_list("content_type__model", "codename", "name")),
    )


def _write_rows() -> None:
    job = api.schedule("project.tasks.record", name="reset-probe", interval=timedelta(minutes=1))
    at = job.next_run_at
    JobRun.objects.create(job=job, token=1, scheduled_for=at, due_at=at, dispatched_at=at)
    User.objects.create_user("reset-probe")


def test_the_reset_empties_what_a_test_wrote_by_deleting(fast_reset: dbreset.FastReset) -> None:
    call_command("flush", verbosity=0, interactive=False)
    after_flush = _post_migrate_rows()
    fast_reset.reset("default")
    _write_rows()
    assert {Job._meta.db_table, JobRun._meta.db_table, User._meta.db_table} <= _filled()
    fast = fast_reset.fast
    fast_reset.reset("default")
    assert fast_reset.fast == fast + 1  # deleted, not flushed
    assert _filled() == {ContentType._meta.db_table, Permission._meta.db_table}
    assert _post_migrate_rows() == after_flush


def test_a_change_to_what_post_migrate_wrote_is_flushed(fast_reset: dbreset.FastReset) -> None:
    fast_reset.reset("default")
    before = _post_migrate_rows()
    Permission.objects.filter(codename="view_job").delete()
    ContentType.objects.create(app_label="reset_probe", model="gone")
    _write_rows()
    full = fast_reset.full
    fast_reset.reset("default")
    assert fast_reset.full == full + 1
    assert _filled() == {ContentType._meta.db_table, Permission._meta.db_table}
    assert _post_migrate_rows() == before
