-- The job table's CHECK constraints that PostgreSQL holds in a shorter form than Django writes
-- them, as they are today, one a block: "-- name: <constraint>", then its condition.
--
-- Why: PostgreSQL rebuilds every CHECK constraint of a table from its stored expression tree at
-- the start of each statement that writes the table. A success rewrites its job row once per
-- execution, so each execution paid for all 51 of schedapp_job's, about 45 KB of trees: 40 % of
-- the PostgreSQL CPU of a door and its success (bench/README.md, "The job table's CHECK
-- constraints, written shorter"). The rules are the same; the trees are smaller: a time range
-- is one range constant (a NULL passes a CHECK anyway, so "col IS NULL OR" goes), a choice is
-- one text[] constant, and "exactly one schedule" counts its schedules.
--
-- The rule itself stays where it is: Django's constraint in schedapp/models.py (what SQLite
-- holds, and what Django's own validation checks), or for the durations' "_readable" bounds,
-- migration 0016's. tests/integration/test_sql_checks.py holds each block here equal to that
-- rule on values at and beyond every bound, and the migrated database equal to this file.
-- A change here goes into the database through a migration with a literal copy (0049 is the
-- first), as for functions.sql; a constraint Django writes again (a changed choice list, say)
-- falls back to Django's longer form, which the test then reports.

-- name: schedapp_job_one_schedule
-- Exactly one of run_at, cron, interval and solar_event; a solar event with its place.
num_nonnulls(run_at, "interval", nullif(cron, ''), nullif(solar_event, '')) = 1
AND (solar_event = '' OR (latitude IS NOT NULL AND longitude IS NOT NULL))

-- name: schedapp_job_state_valid
state::text = ANY ('{scheduled,running,paused,succeeded,dead,cancelled}'::text[])

-- name: schedapp_job_misfire_policy_valid
misfire_policy::text = ANY ('{run_once,skip,run_all,run_recent}'::text[])

-- name: schedapp_job_dst_policy_valid
dst_policy::text = ANY ('{gap_end+first,gap_end+second,gap_end+both,skip+first,skip+second,skip+both,celery}'::text[])

-- name: schedapp_job_latitude_in_range
-- NaN is out of any range: it is more than every number.
latitude >= '-90'::float8 AND latitude <= '90'::float8

-- name: schedapp_job_longitude_in_range
longitude >= '-180'::float8 AND longitude <= '180'::float8

-- name: schedapp_job_run_at_in_range
run_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_interval_anchor_in_range
interval_anchor <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_not_before_in_range
not_before <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_expires_at_in_range
expires_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_next_run_at_in_range
next_run_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_scheduled_for_in_range
scheduled_for <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_lease_expires_at_in_range
lease_expires_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_last_run_at_in_range
last_run_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_created_at_in_range
created_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_updated_at_in_range
updated_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_finish_by_at_in_range
finish_by_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange

-- name: schedapp_job_interval_in_range
"interval" > '0'::interval

-- name: schedapp_job_interval_readable
"interval" <= '900000000 days'::interval

-- name: schedapp_job_retry_backoff_in_range
retry_backoff >= '0'::interval

-- name: schedapp_job_retry_backoff_readable
retry_backoff <= '900000000 days'::interval

-- name: schedapp_job_retry_backoff_max_in_range
retry_backoff_max >= '0'::interval

-- name: schedapp_job_retry_backoff_max_readable
retry_backoff_max <= '900000000 days'::interval

-- name: schedapp_job_misfire_grace_in_range
misfire_grace >= '0'::interval

-- name: schedapp_job_misfire_grace_readable
misfire_grace <= '900000000 days'::interval

-- name: schedapp_job_catchup_window_in_range
catchup_window > '0'::interval

-- name: schedapp_job_catchup_window_readable
catchup_window <= '900000000 days'::interval

-- name: schedapp_job_start_deadline_in_range
start_deadline > '0'::interval

-- name: schedapp_job_start_deadline_readable
start_deadline <= '900000000 days'::interval

-- name: schedapp_job_max_runtime_in_range
max_runtime > '0'::interval

-- name: schedapp_job_max_runtime_readable
max_runtime <= '900000000 days'::interval
