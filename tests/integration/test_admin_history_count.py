"""The runs changelist's counts on a partitioned run history (issue 32).

Without filters the page shows the sum of the partitions' estimates (autovacuum analyses
partitions, never the partitioned parent). With a filter it counts among the newest
``RECENT_IDS`` ids only: a status found only in older partitions is not claimed as an exact
count, the plan reads no older partition, and the page lists what it counted. The runs of one
job (an index) are still counted over all history; an unpartitioned table counts as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from project import admin_data
from schedapp import partitions
from schedapp.admin import filters
from schedapp.models import Job

pytestmark = [pytest.mark.django_db]

RUNS = reverse("admin:schedapp_jobrun_changelist")
SET_NEXT_ID = "SELECT setval(pg_get_serial_sequence('schedapp_jobrun', 'id'), %s, false)"


def _rows(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


@pytest.fixture
def two_partitions() -> Iterator[tuple[str, str]]:
    """3,000 runs in the oldest partition (a fifth failed, a fifth lost), then 3,000 in the
    next, all succeeded but 30 failed; the two partitions' names. The sequence is put back
    after (the rows are rolled back)."""
    parts = partitions.partitions()
    old, new = parts[0], parts[1]
    assert old.lower is None and new.lower is not None
    (before,) = _rows("SELECT nextval(pg_get_serial_sequence('schedapp_jobrun', 'id'))")[0]
    with connection.cursor() as cursor:
        cursor.execute(SET_NEXT_ID, [new.lower - 100_000])
        admin_data.fill(cursor, 1, 3_000, jobs=100)
        cursor.execute(SET_NEXT_ID, [new.lower])
        admin_data.fill_runs(cursor, 3_001, 6_000, jobs=100)
        cursor.execute(
            "UPDATE schedapp_jobrun SET status = CASE WHEN id < %s THEN 'failed' "
            "ELSE 'succeeded' END WHERE id >= %s",
            [new.lower + 30, new.lower],
        )
    assert (
        _rows(
            "SELECT count(*) FROM schedapp_jobrun WHERE status = 'lost' AND id < %s", [new.lower]
        )[0][0]
        == 600
    )
    try:
        yield old.name, new.name
    finally:
        _rows(SET_NEXT_ID.replace("false", "true"), [before])


def _page(client, url: str):  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    text = " ".join(response.content.decode().split())
    counts = [q["sql"] for q in captured if "COUNT(" in q["sql"].upper()]
    return response, text, counts


def _partitions_read(sql: str) -> set[str]:
    plan = "\n".join(r[0] for r in _rows("EXPLAIN (ANALYZE) " + sql))
    names = {p.name for p in partitions.partitions()}
    read = set()
    for line in plan.splitlines():
        match = re.search(r" on (schedapp_jobrun_\w+)", line)
        if match and match.group(1) in names and "never executed" not in line:
            read.add(match.group(1))
    return read


@pytest.mark.postgresql
def test_the_estimate_sums_the_partitions_when_the_parent_was_never_analysed(
    admin_client, monkeypatch, two_partitions
):
    old, new = two_partitions
    # Given partitions analysed by autovacuum, and the parent never (as autovacuum leaves it)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {old}")
        cursor.execute(f"ANALYZE {new}")
        cursor.execute("UPDATE pg_class SET reltuples = -1 WHERE relname = 'schedapp_jobrun'")
    # Then the estimate is the partitions' rows (those never analysed left out)
    assert filters.estimated_rows("schedapp_jobrun") == 6_000
    # ... and the unfiltered page says so
    monkeypatch.setattr(filters, "ESTIMATE_ABOVE", 1_000)
    _response, text, counts = _page(admin_client, RUNS)
    assert "about 6,000 job runs" in text
    assert counts == []


@pytest.mark.postgresql
def test_no_partition_analysed_is_no_estimate(two_partitions):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pg_class SET reltuples = -1 WHERE oid IN (SELECT inhrelid FROM pg_inherits "
            "WHERE inhparent = 'schedapp_jobrun'::regclass) OR relname = 'schedapp_jobrun'"
        )
    assert filters.estimated_rows("schedapp_jobrun") is None


@pytest.mark.postgresql
def test_a_filter_counts_the_newest_runs_only_and_says_so(
    admin_client, monkeypatch, two_partitions
):
    old, new = two_partitions
    monkeypatch.setattr(filters, "RECENT_IDS", 2_000, raising=False)
    monkeypatch.setattr(filters, "COUNT_CAP", 500)
    (newest,) = _rows("SELECT max(id) FROM schedapp_jobrun")[0]

    # A status found only in the old partition (600 runs) is not counted as 0 or 600: the page
    # says it counted the newest ids, and lists none
    response, text, counts = _page(admin_client, RUNS + "?status__exact=lost")
    assert "0 recent job runs match" in text
    assert f"newest 2,000 ids: above {newest - 2_000:,}" in text
    assert "older ones are not counted or listed" in text
    assert list(response.context["cl"].result_list) == []
    # ... and its count read no older partition
    assert len(counts) == 1
    assert _partitions_read(counts[0]) == {new}

    # A rare status in the window: counted there, and exactly those runs listed
    response, text, counts = _page(admin_client, RUNS + "?status__exact=failed")
    window = _rows(
        "SELECT id FROM schedapp_jobrun WHERE status = 'failed' AND id > %s ORDER BY id DESC",
        [newest - 2_000],
    )
    assert "(counted among the newest 2,000 ids" in text
    assert f"{len(window)} recent job runs" in text
    assert [r.pk for r in response.context["cl"].result_list] == [row[0] for row in window]

    # A common status reaches the cap within the newest ids, as before
    _response, text, counts = _page(admin_client, RUNS + "?status__exact=succeeded")
    assert "500+ job runs match" in text
    assert "recent" not in text
    assert old not in _partitions_read(counts[0])


@pytest.mark.postgresql
def test_the_runs_of_one_job_are_counted_over_all_history(
    admin_client, monkeypatch, two_partitions
):
    monkeypatch.setattr(filters, "RECENT_IDS", 2_000, raising=False)
    (job_id,) = _rows("SELECT min(job_id) FROM schedapp_jobrun")[0]
    (total,) = _rows("SELECT count(*) FROM schedapp_jobrun WHERE job_id = %s", [job_id])[0]
    assert total == 60  # 30 in each partition
    response, text, _counts = _page(admin_client, f"{RUNS}?job={job_id}")
    assert "60 job runs match" in text
    assert "recent" not in text
    assert len(response.context["cl"].result_list) == 60


def test_an_unpartitioned_table_counts_exactly_up_to_the_cap(admin_client, monkeypatch):
    # The jobs' table is one table on every store: a filter counts it exactly, as before.
    monkeypatch.setattr(filters, "RECENT_IDS", 10, raising=False)
    monkeypatch.setattr(filters, "COUNT_CAP", 50)
    now = timezone.now()
    Job.objects.bulk_create(
        Job(
            name=f"j-{i}",
            task="project.tasks.record",
            interval=timedelta(minutes=1),
            state="paused" if i % 3 == 0 else "scheduled",
            next_run_at=now,
            scheduled_for=now,
        )
        for i in range(120)
    )
    url = reverse("admin:schedapp_job_changelist")
    _response, text, _counts = _page(admin_client, url + "?state__exact=paused")
    assert "40 jobs match" in text
    # A filter no index serves: only the run table is ever partitioned, so no other page asks
    # the catalog whether it is.
    with CaptureQueriesContext(connection) as captured:
        _response, text, _counts = _page(admin_client, url + "?source__exact=api")
    assert "50+ jobs match" in text
    assert not [q["sql"] for q in captured if "pg_class" in q["sql"]]
    _response, text, _counts = _page(admin_client, url + "?state__exact=scheduled")
    assert "50+ jobs match" in text
    assert "recent" not in text


@pytest.mark.postgresql
def test_count_further_back_counts_the_window_below_the_last(
    admin_client, monkeypatch, two_partitions
):
    old, _new = two_partitions
    monkeypatch.setattr(filters, "RECENT_IDS", 2_000, raising=False)
    (top_of_old,) = _rows(
        "SELECT max(id) FROM schedapp_jobrun WHERE id < %s", [partitions.partitions()[1].lower]
    )[0]
    # Given lost runs in the old partition only: the newest window holds none
    url = RUNS + "?status__exact=lost"
    seen = []
    for _ in range(3):
        response, text, counts = _page(admin_client, url)
        seen.append(re.search(r"(\d[\d,]*) recent job runs? match", text).group(1))
        link = re.search(r'<a href="(\?[^"]+)" class="schedapp-older">count further back</a>', text)
        assert link is not None, text
        url = RUNS + link.group(1).replace("&amp;", "&")
    # Then each link counts the 2,000 ids below the last window, the filter kept: the third
    # window reaches the old partition's newest 2,000 runs, and its lost ones
    (lost,) = _rows(
        "SELECT count(*) FROM schedapp_jobrun WHERE status = 'lost' AND id > %s AND id <= %s",
        [top_of_old - 2_000, top_of_old],
    )[0]
    assert lost > 0
    assert seen == ["0", "0", f"{lost:,}"]
    assert {r.status for r in response.context["cl"].result_list} == {"lost"}
    assert len(response.context["cl"].result_list) == min(lost, 100)
    assert _partitions_read(counts[0]) == {old}
