"""Deadlines per job (start_deadline, skip_late, max_runtime, revoke_overrun, finish_by,
alert_after_failures), the Breach table, and the ledger's "late" fate. Existing jobs get no
deadline. Only cheap steps here (new nullable columns, a new table); the job table's checks
and partial indexes are 0036's, built without blocking writes.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
import schedapp.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('schedapp', '0034_allow_all_retries'),
    ]

    operations = [
        migrations.CreateModel(
            name='Breach',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('late', 'Late (not started within its start deadline)'), ('overrunning', 'Overrunning (running past its max runtime)'), ('missed_finish_by', 'Missed its finish-by time'), ('failing', 'Failing (failed attempts in a row)'), ('dead', 'Dead (retries exhausted)')], max_length=16)),
                ('scheduled_for', models.DateTimeField(help_text='The occurrence it concerns (for finish_by: the deadline instant).')),
                ('opened_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('cleared_at', models.DateTimeField(blank=True, null=True)),
                ('detail', models.TextField(blank=True, default='')),
                ('cleared_detail', models.TextField(blank=True, default='')),
            ],
            options={
                'ordering': ['-opened_at', '-id'],
            },
        ),
        migrations.SeparateDatabaseAndState(
            # existing jobs get no deadline, whatever SCHEDAPP_DEADLINES says at migrate time
            database_operations=[
                migrations.AddField(model_name='job', name='alert_after_failures', field=models.PositiveIntegerField(blank=True, help_text='This many failed attempts in a row make the job failing.', null=True)),
            ],
            state_operations=[
                migrations.AddField(model_name='job', name='alert_after_failures', field=models.PositiveIntegerField(blank=True, default=schedapp.models._default_alert_after_failures, help_text='This many failed attempts in a row make the job failing.', null=True)),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            # existing jobs get no deadline, whatever SCHEDAPP_DEADLINES says at migrate time
            database_operations=[
                migrations.AddField(model_name='job', name='finish_by', field=models.TimeField(blank=True, help_text="Wall-clock time in the job's zone by which the day's occurrence must have succeeded.", null=True)),
            ],
            state_operations=[
                migrations.AddField(model_name='job', name='finish_by', field=models.TimeField(blank=True, default=schedapp.models._default_finish_by, help_text="Wall-clock time in the job's zone by which the day's occurrence must have succeeded.", null=True)),
            ],
        ),
        migrations.AddField(
            model_name='job',
            name='finish_by_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            # existing jobs get no deadline, whatever SCHEDAPP_DEADLINES says at migrate time
            database_operations=[
                migrations.AddField(model_name='job', name='max_runtime', field=models.DurationField(blank=True, help_text='A run still going this long after it started is overrunning.', null=True)),
            ],
            state_operations=[
                migrations.AddField(model_name='job', name='max_runtime', field=models.DurationField(blank=True, default=schedapp.models._default_max_runtime, help_text='A run still going this long after it started is overrunning.', null=True)),
            ],
        ),
        migrations.AddField(
            model_name='job',
            name='revoke_overrun',
            field=models.BooleanField(db_default=False, default=schedapp.models._default_revoke_overrun, help_text='Revoke an overrunning run (terminated on a prefork worker).'),
        ),
        migrations.AddField(
            model_name='job',
            name='skip_late',
            field=models.BooleanField(db_default=False, default=schedapp.models._default_skip_late, help_text="An occurrence found past its start deadline by the claim is not run: it is recorded as late (Kubernetes' startingDeadlineSeconds)."),
        ),
        migrations.SeparateDatabaseAndState(
            # existing jobs get no deadline, whatever SCHEDAPP_DEADLINES says at migrate time
            database_operations=[
                migrations.AddField(model_name='job', name='start_deadline', field=models.DurationField(blank=True, help_text='An occurrence not started this long after its time is late.', null=True)),
            ],
            state_operations=[
                migrations.AddField(model_name='job', name='start_deadline', field=models.DurationField(blank=True, default=schedapp.models._default_start_deadline, help_text='An occurrence not started this long after its time is late.', null=True)),
            ],
        ),
        migrations.AlterField(
            model_name='occurrence',
            name='fate',
            field=models.CharField(choices=[('misfired', 'Misfired (found late; the misfire policy ran another or none)'), ('outside_window', 'Outside the catch-up window'), ('paused', 'Passed while paused'), ('cancelled', 'Job cancelled'), ('quarantined', 'Job quarantined'), ('overlapped', 'Overlapped a run in flight (overlap policy skip)'), ('buffer_full', 'Dropped from a full buffer (overlap policy buffer_all)'), ('excluded', "Excluded by the job's calendar"), ('merged', "Merged by the job's calendar into a run moved onto or over it"), ('late', 'Past its start deadline when found (skip_late)')], max_length=16),
        ),
        migrations.AddField(
            model_name='breach',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='breaches', to='schedapp.job'),
        ),
        migrations.AddIndex(
            model_name='breach',
            index=models.Index(fields=['job', 'scheduled_for'], name='schedapp_breach_job'),
        ),
        migrations.AddConstraint(
            model_name='breach',
            constraint=models.UniqueConstraint(condition=models.Q(('cleared_at__isnull', True)), fields=('job', 'kind'), name='schedapp_breach_open_once'),
        ),
    ]
