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

pytestmark = [pytest.mark.django_db]

FILL_JOBS = """
INSERT INTO schedapp_job (
    name, task, args, kwargs, run_at, cron, timezone, interval, state, priority, queue,
    max_retries, retry_backoff, retry_backoff_max, jitter, lease_seconds, misfire_policy,
    misfire_grace, misfire_max_catchup, next_run_at, scheduled_for, retry_count, missed_runs,
    claimed_by, lease_expires_at, token, source, last_run_at, last_status, last_error,
    created_at, updated_at)
SELECT
    'job-' || i,
    (ARRAY['project.tasks.record', 'project.tasks.noop', 'project.tasks.add'])[1 + i %% 3],
    '[]', '{"label": "x"}', NULL,
    CASE WHEN i %% 2 = 0 THEN '0 0 * * 1-5' ELSE '' END,
    (ARRAY['Europe/Paris', 'UTC', 'America/New_York'])[1 + i %% 3],
    CASE WHEN i %% 2 = 1 THEN make_interval(secs => 60 + i %% 600) END,
    (ARRAY['running', 'dead', 'paused', 'scheduled', 'scheduled', 'scheduled', 'scheduled',
           'scheduled', 'succeeded', 'cancelled'])[1 + i %% 10],
    i %% 3, 'q' || (i %% 4), 3, interval '10 seconds', interval '1 hour', 0, 60, 'run_once',
    interval '60 seconds', 100,
    now() + make_interval(secs => i), now() + make_interval(secs => i), i %% 4, 0,
    CASE WHEN i %% 10 = 0 THEN 'beat-' || (i %% 7) ELSE '' END,
    CASE WHEN i %% 10 = 0 THEN now() + interval '60 seconds' END,
    i, 'api', now() - interval '1 hour',
    CASE WHEN i %% 4 = 0 THEN 'failed' ELSE 'succeeded' END,
    CASE WHEN i %% 10 = 1 THEN 'RuntimeError: boom ' || i ELSE '' END,
    now(), now()
FROM generate_series(%(start)s, %(stop)s) AS i
"""

FILL_RUNS = """
INSERT INTO schedapp_jobrun (
    job_id, token, attempt, scheduled_for, due_at, claimed_by, dispatched_at,
    started_at, finished_at, heartbeat_at, heartbeats, worker, admission, task_id, status,
    stale, error, traceback)
SELECT
    j.id, 1000 + g.n, 1, now() - make_interval(secs => g.n), now() - make_interval(secs => g.n),
    'beat-1', now(), now(), now() + interval '2 seconds', NULL, 0, 'worker1@host', '',
    'schedapp:' || j.id || ':' || (1000 + g.n),
    (ARRAY['succeeded', 'failed', 'lost', 'succeeded'])[1 + g.n %% 4], false,
    CASE WHEN g.n %% 4 = 1 THEN 'RuntimeError: boom' ELSE '' END,
    CASE WHEN g.n %% 4 = 1 THEN repeat('Traceback line\n', 50) ELSE '' END
FROM (SELECT id, row_number() OVER (ORDER BY id) AS rn FROM schedapp_job) j
JOIN generate_series(%(start)s, %(stop)s) AS g(n) ON j.rn = 1 + (g.n %% %(jobs)s)
"""


def fill(start: int, stop: int, jobs_total: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(FILL_JOBS, {"start": start, "stop": stop})
        cursor.execute(FILL_RUNS, {"start": start, "stop": stop, "jobs": jobs_total})


JOB_VIEWS = [
    "",
    "?state__exact=scheduled",
    "?state__exact=dead",
    "?task=project.tasks.noop",
    "?queue=q2",
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
