"""The jobs and runs changelists cost a small, constant number of bounded queries.

10,000 jobs and 10,000 runs are inserted with one SQL statement each; every changelist view
(plain, filtered, searched, a later page) must then run the same few queries as with ten
rows, and none may count a whole table.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from project import admin_data

pytestmark = [pytest.mark.django_db]

def fill(start: int, stop: int, jobs_total: int) -> None:
    with connection.cursor() as cursor:
        admin_data.fill(cursor, start, stop, jobs=jobs_total)


JOB_VIEWS = [
    "",
    "?state__exact=scheduled",
    "?state__exact=dead",
    "?task=project.tasks.noop",
    "?queue=low",
    "?queue=__default__",
    "?kind=cron",
    "?q=job-99",
    "?p=3",
    "?source__exact=api&kind=interval",
]
RUN_VIEWS = ["", "?status__exact=failed", "?stale__exact=0", "?p=5", "?q=schedapp:1:1001"]


def queries_for(client, url: str) -> list[str]:  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return [q["sql"] for q in captured]


def check_bounded(sqls: list[str], url: str) -> None:
    for sql in sqls:
        upper = sql.upper()
        if "COUNT(" in upper and "SCHEDAPP_" in upper:
            assert "LIMIT" in upper, f"unbounded count for {url}: {sql}"
        assert "SELECT DISTINCT" not in upper or "LIMIT" in upper, f"{url}: {sql}"


def test_changelists_run_the_same_few_queries_with_10_rows_and_10000(
    admin_client, django_assert_max_num_queries
):
    jobs_url = reverse("admin:schedapp_job_changelist")
    runs_url = reverse("admin:schedapp_jobrun_changelist")
    views = [jobs_url + v for v in JOB_VIEWS] + [runs_url + v for v in RUN_VIEWS]
    job_id = None

    # Given ten jobs and ten runs
    fill(1, 10, 10)
    small = {url: len(queries_for(admin_client, url)) for url in views}

    # When the tables grow to 10,000 jobs and 10,000 runs
    fill(11, 10_000, 10_000)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM schedapp_job")
        assert cursor.fetchone()[0] == 10_000
        cursor.execute("SELECT min(job_id) FROM schedapp_jobrun")
        job_id = cursor.fetchone()[0]

    # Then every view runs exactly as many queries as before, a handful, all bounded
    for url in views:
        with django_assert_max_num_queries(8):
            sqls = queries_for(admin_client, url)
        assert len(sqls) == small[url], (url, sqls)
        check_bounded(sqls, url)
    # ... a page shows 100 rows, with their lease, schedule and last status from the row
    page = admin_client.get(jobs_url)
    assert len(page.context["cl"].result_list) == 100
    text = page.content.decode().replace("<wbr>", "")  # line-break hints, not text
    assert "At 00:00, Monday through Friday (Europe/Paris)" in text
    # ... and the runs of one job, as linked from its page, are as cheap
    with django_assert_max_num_queries(8):
        sqls = queries_for(admin_client, f"{runs_url}?job={job_id}")
    check_bounded(sqls, "runs of one job")


def test_the_count_is_estimated_without_filters_and_capped_with_them(admin_client, settings):
    from schedapp.admin import filters as admin_filters

    fill(1, 3_000, 3_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedapp_job")
    url = reverse("admin:schedapp_job_changelist")
    old_above, old_cap = admin_filters.ESTIMATE_ABOVE, admin_filters.COUNT_CAP
    admin_filters.ESTIMATE_ABOVE, admin_filters.COUNT_CAP = 1_000, 500
    try:
        plain = admin_client.get(url)
        filtered = admin_client.get(url + "?state__exact=scheduled")
    finally:
        admin_filters.ESTIMATE_ABOVE, admin_filters.COUNT_CAP = old_above, old_cap
    assert plain.context["cl"].paginator.count_is_estimate
    assert "about 3,000 jobs" in plain.content.decode()
    assert "500+ jobs" in filtered.content.decode()


def test_deep_pages_fetch_ids_first_and_show_the_right_rows(admin_client):
    fill(1, 3_000, 3_000)
    url = reverse("admin:schedapp_jobrun_changelist") + "?p=25"  # rows 2,401 to 2,500
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(url)
    ids = [run.pk for run in response.context["cl"].result_list]
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM schedapp_jobrun ORDER BY id DESC OFFSET 2400 LIMIT 100")
        expected = [row[0] for row in cursor.fetchall()]
    assert ids == expected
    offsets = [q["sql"] for q in captured if "OFFSET 2400" in q["sql"]]
    assert len(offsets) == 1 and "INNER JOIN" not in offsets[0]  # the join sees 100 rows only
