"""Real-world Celery beat entries, collected from public open-source projects (data, not code).

Each entry is one ``beat_schedule`` (``CELERYBEAT_SCHEDULE``, ``add_periodic_task``) item as the
project wrote it, with where it comes from: ``source`` is ``owner/repo:path``, ``commit`` the
revision it was read at. ``schedule`` is built with the real ``celery.schedules`` objects and the
same arguments (a number stays a number, a ``timedelta`` a ``timedelta``); where the project
computes a value from a setting, its default is used and ``note`` says so. ``zone`` is the
project's own Celery time zone, for information: the differential test replays every entry in
several zones. Entries built with a project's own schedule classes (Saleor's
``promotion_webhook_schedule``, MIT ODL's ``OffsettingSchedule``, fastapi_best_architecture's
``TzAwareCrontab``) are left out: they are that project's code, not Celery's.

For ``add_periodic_task`` calls, ``name`` is the ``name=`` given (or the task when none is) and
``task`` the dotted name of the task the signature points at.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery.schedules import crontab, schedule

SENTRY = "getsentry/sentry:src/sentry/conf/server.py"
SALEOR = "saleor/saleor:saleor/settings.py"
TREEHERDER = "mozilla/treeherder:treeherder/config/settings.py"
RTD = "readthedocs/readthedocs.org:readthedocs/settings/base.py"
DOJO = "DefectDojo/django-DefectDojo:dojo/settings/settings.dist.py"
PAPERLESS = "paperless-ngx/paperless-ngx:src/paperless/settings/custom.py"
KOBO = "kobotoolbox/kpi:kobo/settings/base.py"
KITSUNE = "mozilla/kitsune:kitsune/celery_beat.py"
CARE = "ohcnetwork/care:care/facility/tasks/__init__.py"
POSTHOG = "PostHog/posthog:posthog/tasks/scheduled.py"
HYDROSHARE = "hydroshare/hydroshare:hs_core/tasks.py"
AVA = "saskenuba/ava-lembretes:ava_rememberme/celeryconfig.py"
PLEIO = "jwellner/pleio-backend:backend2/crontab.py"
WEBEE = "webee/customer-service-api:src/app/config/celery_task"
OPENWISP = "openwisp/openwisp-monitoring:tests/openwisp2/settings.py"
MITX = "mitodl/mitxonline:main/settings.py"
BLOGBAR = "hustlzp/blogbar:celery_proj/config.py"
PMLF = "AlbanoLucas/automacao_PMLF:celery_config.py"
FBA = "fastapi-practices/fastapi_best_architecture:backend/app/task/tasks/beat.py"

COMMITS = {
    SENTRY: "000b735536174c877f044a17a57ea728dbe48178",
    SALEOR: "723cd4eba87dfc72822ade45dc08a3caa548428d",
    TREEHERDER: "dc3080dd746d4732d5e06c0272471834d4639da0",
    RTD: "7937196123747181054d4c2361ec81f93c37f8f2",
    DOJO: "7cfa159a6767b0ac6e66f3b1597a997e607e7308",
    PAPERLESS: "b0e0e8a35373a5d9d588a507cb63c79e50a23403",
    KOBO: "2e5efb0172e64fc8c8de222039f2aa02c6d6be8e",
    KITSUNE: "dcfa333911ed376a14c59eee83bde0345d03ea20",
    CARE: "69c2b831457ba1e47b68ada0eae9582d3c32b865",
    POSTHOG: "002af38742b9357a1f21e8190eb9490b3b224702",
    HYDROSHARE: "65eb8ff2f62ae40ad57a80d032df23b5fd195d57",
    AVA: "ea0cd3f162d150c8d71db2a465b79c4ff5a6153a",
    PLEIO: "67ce379fc5d7029b2e29bbd347f2a71fe0955d1f",
    WEBEE: "37efe7819d5df5d0ebd4bdf9d0072a6848813d18",
    OPENWISP: "86558ebde44dc12e39525e60acbfd37cc1ba9587",
    MITX: "b3c9730edd606719f624086f2e8fab3223356f94",
    BLOGBAR: "4d3703af1a9bdc6d0db97907bcea65432ace49aa",
    PMLF: "bcdf823cef9027592186b777008337ef5a6fde34",
    FBA: "",  # read through the code search index; no revision recorded there
}
ZONES = {
    SENTRY: "UTC",
    SALEOR: "UTC",
    TREEHERDER: "UTC",
    RTD: "UTC",
    DOJO: "UTC",
    PAPERLESS: "UTC",
    KOBO: "UTC",
    KITSUNE: "US/Pacific",
    CARE: "Asia/Kolkata",
    POSTHOG: "UTC",
    HYDROSHARE: "UTC",
    AVA: "America/Sao_Paulo",
    PLEIO: "Europe/Amsterdam",
    WEBEE: "UTC",
    OPENWISP: "Europe/Rome",
    MITX: "UTC",
    BLOGBAR: "Asia/Shanghai",
    PMLF: "America/Sao_Paulo",
    FBA: "Asia/Shanghai",
}


def _e(source: str, name: str, task: str, sched: Any, **extra: Any) -> dict[str, Any]:
    commit = extra.pop("commit", COMMITS[source])
    return {
        "source": source,
        "commit": commit,
        "zone": ZONES[source],
        "name": name,
        "task": task,
        "schedule": sched,
        **extra,
    }


ENTRIES: list[dict[str, Any]] = [
    # --- Sentry (control and region silo schedules) ---------------------------------------
    _e(SENTRY, "check-auth", "sentry.tasks.check_auth", crontab(minute="*/1")),
    _e(
        SENTRY,
        "sync-options-control",
        "sentry.tasks.options.sync_options_control",
        timedelta(seconds=10),
    ),
    _e(
        SENTRY,
        "schedule-deletions-control",
        "sentry.tasks.deletion.run_scheduled_deletions_control",
        crontab(minute="*/15"),
    ),
    _e(
        SENTRY,
        "reattempt-deletions-control",
        "sentry.tasks.deletion.reattempt_deletions_control",
        crontab(hour=10, minute=0),
    ),
    _e(
        SENTRY,
        "hybrid-cloud-repair-mappings",
        "sentry.tasks.organization_mapping.repair_mappings",
        crontab(minute=0, hour="*/1"),
    ),
    _e(SENTRY, "schedule-digests", "sentry.tasks.digests.schedule_digests", timedelta(seconds=30)),
    _e(
        SENTRY, "clear-expired-snoozes", "sentry.tasks.clear_expired_snoozes", crontab(minute="*/5")
    ),
    _e(
        SENTRY,
        "schedule-auto-resolution",
        "sentry.tasks.schedule_auto_resolution",
        crontab(minute="*/10"),
    ),
    _e(
        SENTRY,
        "schedule-weekly-organization-reports-new",
        "sentry.tasks.weekly_reports.schedule_organizations",
        crontab(minute=0, hour=12, day_of_week="monday"),
    ),
    _e(
        SENTRY,
        "schedule-monthly-invite-missing-org-members",
        "sentry.tasks.invite_missing_org_members.schedule_organizations",
        crontab(minute=0, hour=7, day_of_month="1"),
    ),
    _e(
        SENTRY,
        "monitor-release-adoption",
        "sentry.release_health.tasks.monitor_release_adoption",
        crontab(minute=0),
    ),
    _e(
        SENTRY,
        "snuba-subscription-checker",
        "sentry.snuba.tasks.subscription_checker",
        crontab(minute="*/20"),
    ),
    _e(
        SENTRY,
        "transaction-name-clusterer",
        "sentry.ingest.transaction_clusterer.tasks.spawn_clusterers",
        crontab(minute=17),
    ),
    _e(
        SENTRY,
        "auto-enable-codecov",
        "sentry.tasks.auto_enable_codecov.enable_for_org",
        crontab(minute=30, hour="0"),
    ),
    _e(
        SENTRY,
        "weekly-escalating-forecast",
        "sentry.tasks.weekly_escalating_forecast.run_escalating_forecast",
        crontab(minute=0, hour="*/6"),
    ),
    _e(
        SENTRY,
        "github_comment_reactions",
        "sentry.tasks.integrations.github_comment_reactions",
        crontab(minute=0, hour=16),
    ),
    # --- Saleor -------------------------------------------------------------------------
    _e(
        SALEOR,
        "delete-empty-allocations",
        "saleor.warehouse.tasks.delete_empty_allocations_task",
        timedelta(days=1),
    ),
    _e(
        SALEOR,
        "deactivate-preorder-for-variants",
        "saleor.product.tasks.deactivate_preorder_for_variants_task",
        timedelta(hours=1),
    ),
    _e(
        SALEOR,
        "delete_expired_orders",
        "saleor.order.tasks.delete_expired_orders_task",
        crontab(hour=2, minute=0),
    ),
    _e(
        SALEOR,
        "delete-old-export-files",
        "saleor.csv.tasks.delete_old_export_files",
        crontab(hour=1, minute=0),
    ),
    _e(
        SALEOR,
        "expire-orders",
        "saleor.order.tasks.expire_orders_task",
        timedelta(seconds=300),
        note="BEAT_EXPIRE_ORDERS_AFTER_TIMEDELTA, default '5 minutes'",
    ),
    _e(
        SALEOR,
        "release-funds-for-abandoned-checkouts",
        "saleor.payment.tasks.transaction_release_funds_for_checkout_task",
        timedelta(minutes=10),
    ),
    _e(
        SALEOR,
        "recalculate-promotion-rules",
        "saleor.product.tasks.update_variant_relations_for_active_promotion_rules_task",
        timedelta(seconds=30),
        note="BEAT_PRICE_RECALCULATION_SCHEDULE, default '30 seconds'",
    ),
    # --- Mozilla Treeherder (relative=True) --------------------------------------------------
    _e(
        TREEHERDER,
        "fetch-push-logs-every-5-minutes",
        "fetch-push-logs",
        timedelta(minutes=5),
        relative=True,
    ),
    _e(
        TREEHERDER,
        "publish_stats",
        "publish-stats",
        crontab(minute="*/20"),
        relative=True,
        note="minute=f'*/{CELERY_STATS_PUBLICATION_DELAY}' with the delay set to 20",
    ),
    # --- Read the Docs -------------------------------------------------------------------
    _e(
        RTD,
        "every-minute-finish-unhealthy-builds",
        "readthedocs.projects.tasks.utils.finish_unhealthy_builds",
        crontab(minute="*"),
    ),
    _e(
        RTD,
        "every-day-delete-old-page-views",
        "readthedocs.analytics.tasks.delete_old_page_counts",
        crontab(minute=27, hour="*/6"),
    ),
    _e(
        RTD,
        "every-day-delete-old-buildconfig-models",
        "readthedocs.builds.tasks.remove_orphan_build_config",
        crontab(minute=30, hour=2),
    ),
    _e(
        RTD,
        "weekly-delete-old-personal-audit-logs",
        "readthedocs.audit.tasks.delete_old_personal_audit_logs",
        crontab(day_of_week="wed", minute=0, hour=7),
    ),
    _e(
        RTD,
        "every-30m-delete-inactive-external-versions",
        "readthedocs.builds.tasks.delete_closed_external_versions",
        crontab(minute="*/30", hour="*"),
    ),
    _e(
        RTD,
        "every-hour-delete-old-build-objects",
        "readthedocs.builds.tasks.delete_old_build_objects",
        crontab(minute=22, hour="*"),
    ),
    # --- DefectDojo ----------------------------------------------------------------------
    _e(DOJO, "add-alerts", "dojo.notifications.tasks.add_alerts", timedelta(hours=1)),
    _e(DOJO, "cleanup-alerts", "dojo.notifications.tasks.cleanup_alerts", timedelta(hours=8)),
    _e(DOJO, "dedupe-delete", "dojo.tasks.async_dupe_delete", timedelta(minutes=1)),
    _e(
        DOJO,
        "compute-sla-age-and-notify",
        "dojo.notifications.tasks.async_sla_compute_and_notify_task",
        crontab(hour=7, minute=30),
    ),
    _e(
        DOJO,
        "risk_acceptance_expiration_handler",
        "dojo.risk_acceptance.helper.expiration_handler",
        crontab(minute=0, hour="*/3"),
    ),
    _e(
        DOJO,
        "clear_sessions",
        "dojo.tasks.clear_sessions",
        crontab(hour=0, minute=0, day_of_week=0),
    ),
    # --- Paperless-ngx (crontab(minute, hour, day_week, day_month, month) from env defaults) ---
    _e(
        PAPERLESS,
        "Check all e-mail accounts",
        "paperless_mail.tasks.process_mail_accounts",
        crontab("*/10", "*", "*", "*", "*"),
        note="PAPERLESS_EMAIL_TASK_CRON default '*/10 * * * *'",
    ),
    _e(
        PAPERLESS,
        "Train the classifier",
        "documents.tasks.train_classifier",
        crontab("5", "*/1", "*", "*", "*"),
        note="PAPERLESS_TRAIN_TASK_CRON default '5 */1 * * *'",
    ),
    _e(
        PAPERLESS,
        "Perform sanity check",
        "documents.tasks.sanity_check",
        crontab("30", "0", "sun", "*", "*"),
        note="PAPERLESS_SANITY_TASK_CRON default '30 0 * * sun'",
    ),
    _e(
        PAPERLESS,
        "Rebuild LLM index",
        "documents.tasks.llmindex_index",
        crontab("10", "2", "*", "*", "*"),
        note="PAPERLESS_LLM_INDEX_TASK_CRON default '10 2 * * *'",
    ),
    # --- KoboToolbox KPI -----------------------------------------------------------------
    _e(
        KOBO,
        "log-stuck-exports-and-mark-failed",
        "kobo.apps.openrosa.apps.viewer.tasks.log_stuck_exports_and_mark_failed",
        timedelta(hours=6),
    ),
    _e(KOBO, "mass-emails-send", "kobo.apps.mass_emails.tasks.send_emails", crontab(minute=1)),
    _e(
        KOBO,
        "fix-stale-submissions-suspended-flag",
        "kobo.apps.openrosa.apps.logger.tasks.fix_stale_submissions_suspended_flag",
        crontab(minute="*/15", hour="2-5", day_of_week=0),
    ),
    _e(
        KOBO,
        "sync-storage-counters",
        "kobo.apps.openrosa.apps.logger.tasks.sync_storage_counters",
        crontab(minute=30, hour=0, day_of_week=0),
    ),
    _e(
        KOBO,
        "mass-emails-send (MASS_EMAILS_CONDENSE_SEND)",
        "kobo.apps.mass_emails.tasks.send_emails",
        crontab(minute="1-59/5"),
    ),
    # --- Mozilla Kitsune (SUMO) ------------------------------------------------------------
    _e(
        KITSUNE,
        "update_l10n_contributor_metrics",
        "kitsune.dashboards.tasks.update_l10n_contributor_metrics",
        crontab(day_of_month="1", hour="0", minute="30"),
    ),
    _e(
        KITSUNE,
        "cohort_analysis",
        "kitsune.kpi.tasks.cohort_analysis",
        crontab(hour="0", minute="30", day_of_week="1"),
    ),
    _e(
        KITSUNE,
        "sync_product_versions",
        "kitsune.products.tasks.sync_product_versions",
        crontab(hour="*/6", minute="10"),
    ),
    _e(
        KITSUNE,
        "cleanup_old_spam",
        "kitsune.questions.tasks.cleanup_old_spam",
        crontab(hour="22", minute="0", day_of_week="0,2,4"),
    ),
    _e(
        KITSUNE,
        "cleanup_old_account_events",
        "kitsune.users.tasks.cleanup_old_account_events",
        crontab(hour="2", minute="0", day_of_week="0"),
    ),
    _e(
        KITSUNE,
        "reprocess_failed_account_events",
        "kitsune.users.tasks.process_unprocessed_account_events",
        crontab(hour="*/4", minute="15"),
    ),
    _e(
        KITSUNE,
        "cleanup_old_translation_records",
        "kitsune.wiki.tasks.cleanup_old_translation_records",
        crontab(hour="1", minute="30", day_of_week="0"),
    ),
    _e(
        KITSUNE,
        "send_weekly_ready_for_review_digest",
        "kitsune.wiki.tasks.send_weekly_ready_for_review_digest",
        crontab(hour="4", minute="0", day_of_week="5"),
    ),
    # --- Open Healthcare Network CARE (add_periodic_task) -------------------------------------
    _e(
        CARE,
        "summarise_triage",
        "care.facility.tasks.summarisation.summarize_triage",
        crontab(hour="*/4", minute="59"),
    ),
    _e(
        CARE,
        "summarise_patient",
        "care.facility.tasks.summarisation.summarize_patient",
        crontab(hour="*/1", minute="59"),
    ),
    _e(
        CARE,
        "summarise_tests",
        "care.facility.tasks.summarisation.summarize_tests",
        crontab(hour="23", minute="59"),
    ),
    _e(
        CARE,
        "load_redis_index",
        "care.facility.tasks.redis_index.load_redis_index",
        crontab(hour="*", minute="0"),
    ),
    # --- PostHog (add_periodic_task) -----------------------------------------------------
    _e(POSTHOG, "10 sec heartbeat", "posthog.tasks.tasks.redis_heartbeat", 10),
    _e(
        POSTHOG, "tasks run state metrics", "posthog.tasks.tasks.capture_task_run_state_metrics", 60
    ),
    _e(
        POSTHOG,
        "update survey iteration based on date",
        "posthog.tasks.tasks.update_survey_iteration",
        crontab(hour="*/12"),
    ),
    _e(
        POSTHOG,
        "posthog.tasks.tasks.update_event_partitions",
        "posthog.tasks.tasks.update_event_partitions",
        crontab(day_of_week="mon,fri", hour="0", minute="0"),
    ),
    _e(
        POSTHOG,
        "reconcile managed warehouse SQL editor tables",
        "products.data_warehouse.backend.facade.tasks.reconcile_all_managed_warehouse_tables_task",
        crontab(minute="17,47"),
    ),
    _e(
        POSTHOG,
        "verify and fix auth token cache",
        "posthog.tasks.auth_token_cache_verification.verify_and_fix_auth_token_cache_task",
        crontab(hour="*/6", minute="40"),
    ),
    _e(
        POSTHOG,
        "refresh signals repository activity",
        "products.signals.backend.tasks.refresh_signal_repository_activity",
        crontab(day_of_week="mon", hour="5", minute="35"),
    ),
    _e(
        POSTHOG,
        "posthog.tasks.tasks.clean_stale_partials",
        "posthog.tasks.tasks.clean_stale_partials",
        crontab(day_of_week="fri", hour="0", minute="0"),
    ),
    # --- HydroShare (add_periodic_task; day_of_week AND day_of_month) ---------------------------
    _e(
        HYDROSHARE,
        "send_over_quota_emails",
        "hs_core.tasks.send_over_quota_emails",
        crontab(minute=0, hour=8, day_of_week=1, day_of_month="1-7"),
    ),
    _e(
        HYDROSHARE,
        "update_from_geoconnex_task",
        "hs_core.tasks.update_from_geoconnex_task",
        crontab(minute=30, hour=7, day_of_month=1),
    ),
    # --- ava-lembretes ---------------------------------------------------------------------
    _e(
        AVA,
        "refresh-disciplines",
        "ava_rememberme.tasks.databaseRefreshDisciplines",
        crontab(minute="0", hour="3", day_of_month="1-7", day_of_week="0"),
    ),
    _e(
        AVA,
        "refresh-all-users",
        "ava_rememberme.tasks.databaseRefreshAllUsers",
        crontab(day_of_month="10,20,30"),
        commit="533f1bd9574aa4b3658dbd1f56215d8a051e71d3",
    ),
    _e(
        AVA,
        "subtract-day",
        "ava_rememberme.tasks.databaseSubtractDay",
        crontab(minute="59", hour="23"),
        commit="533f1bd9574aa4b3658dbd1f56215d8a051e71d3",
    ),
    # --- Pleio backend ---------------------------------------------------------------------
    _e(PLEIO, "hourly", "core.tasks.cronjobs.dispatch_hourly_cron", crontab(minute=55, hour="*")),
    _e(
        PLEIO,
        "weekly",
        "background.dispatch_cron",
        crontab(minute=0, hour=21, day_of_week="sunday"),
        commit="ed1510663f784aaa776a78db29221309f1da48ab",
        args=["weekly"],
    ),
    _e(
        PLEIO,
        "yearly",
        "background.dispatch_cron",
        crontab(minute=0, hour=21, day_of_month=1, month_of_year=1),
        commit="ed1510663f784aaa776a78db29221309f1da48ab",
        args=["yearly"],
    ),
    _e(
        PLEIO,
        "weekly (monday)",
        "core.tasks.cronjobs.dispatch_weekly_cron",
        crontab(minute=0, hour=4, day_of_week="monday"),
    ),
    # --- customer-service-api (relative=True) ------------------------------------------------
    _e(
        WEBEE,
        "test_job-E1d",
        "app.task.tasks.test_job",
        timedelta(days=1),
        relative=True,
        note="test.py",
    ),
    _e(
        WEBEE,
        "test_job-E0.5d",
        "app.task.tasks.test_job",
        timedelta(days=0.5),
        relative=True,
        note="__init__.py",
    ),
    # --- OpenWISP monitoring (relative=True) ----------------------------------------------------
    _e(
        OPENWISP,
        "run_checks",
        "openwisp_monitoring.check.tasks.run_checks",
        timedelta(minutes=5),
        relative=True,
    ),
    _e(
        OPENWISP,
        "run_iperf3_checks",
        "openwisp_monitoring.check.tasks.run_checks",
        crontab(minute="*/5", hour="0-6"),
        relative=True,
    ),
    # --- MIT Open Learning mitxonline -----------------------------------------------------------
    _e(
        MITX,
        "retry-failed-edx-enrollments",
        "openedx.tasks.retry_failed_edx_enrollments",
        1800,
        note="RETRY_FAILED_EDX_ENROLLMENT_FREQUENCY, default 60 * 30",
    ),
    _e(
        MITX,
        "process-google-sheets-requests",
        "sheets.tasks.process_google_sheets_requests",
        crontab(minute="*", hour="10-2"),
        note="minute=CRON_PROCESS_REFUND_REQUESTS_MINUTES, default '*'",
    ),
    _e(
        MITX,
        "clear-expired-tokens",
        "main.tasks.run_clear_tokens",
        crontab(minute=0, hour=9, day_of_week=1),
    ),
    # --- blogbar (spaces inside a crontab string) -------------------------------------------
    _e(
        BLOGBAR,
        "every_six_hours",
        "celery_proj.tasks.grab",
        crontab(hour="0, 6, 12, 18", minute=30),
        commit="3730b57c38e228b350e496be07ccb321f4e7dd1a",
    ),
    _e(BLOGBAR, "grab", "celery_proj.tasks.grab", crontab(hour="6, 12, 18, 23", minute=0)),
    # --- automacao_PMLF --------------------------------------------------------------------------
    _e(
        PMLF,
        "executar-tarefa",
        "tasks.run_my_script",
        crontab(hour=8, minute=30, day_of_week="1-5"),
    ),
    # --- fastapi_best_architecture (an explicit celery.schedules.schedule) ---------------------
    _e(FBA, "测试同步任务", "task_demo", schedule(5)),
]
