"""Calendars on jobs: ``calendar`` (nullable, PROTECT), ``calendar_mode`` and ``calendar_roll``
with database defaults (``exclude``, ``skip``), so existing rows follow no calendar and an older
release's inserts during a rolling deploy keep today's behaviour; PostgreSQL adds them without
rewriting the table. The partial index of the jobs following a calendar is 0030's (built
CONCURRENTLY). The ledger's fates gain ``excluded`` and ``merged`` (choices only: no database change).

The foreign key has no database constraint (PostgreSQL's would be deferred: a trigger event
queued for every job inserted and held to commit); PROTECT is enforced by the ORM."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('schedapp', '0028_calendars'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='calendar',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, help_text='A calendar this job follows: its exclusions, or its only allowed windows.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='schedapp.calendar'),
        ),
        migrations.AddField(
            model_name='job',
            name='calendar_mode',
            field=models.CharField(choices=[('exclude', 'Exclude: never run inside the calendar'), ('only', "Only: run only inside the calendar's windows")], db_default='exclude', default='exclude', help_text='exclude: never run inside the calendar; only: run only inside it.', max_length=8),
        ),
        migrations.AddField(
            model_name='job',
            name='calendar_roll',
            field=models.CharField(choices=[('skip', 'Skip an occurrence that falls in an exclusion'), ('next_business_day', 'Move it to the next business day'), ('previous_business_day', 'Move it to the previous business day'), ('defer', 'Defer it to the end of the exclusion')], db_default='skip', default='skip', help_text='An occurrence the calendar excludes: skipped, moved to the next or previous business day, or deferred to the end of the exclusion.', max_length=24),
        ),
        migrations.AlterField(
            model_name='occurrence',
            name='fate',
            field=models.CharField(choices=[('misfired', 'Misfired (found late; the misfire policy ran another or none)'), ('outside_window', 'Outside the catch-up window'), ('paused', 'Passed while paused'), ('cancelled', 'Job cancelled'), ('quarantined', 'Job quarantined'), ('overlapped', 'Overlapped a run in flight (overlap policy skip)'), ('buffer_full', 'Dropped from a full buffer (overlap policy buffer_all)'), ('excluded', "Excluded by the job's calendar"), ('merged', "Merged by the job's calendar into a run moved onto or over it")], max_length=16),
        ),
    ]
